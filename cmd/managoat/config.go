package main

import (
	"os"
	"path/filepath"
	"strings"
)

// envProvider is the environment variable naming the default provider, so
// that --provider is not needed on every call.
const envProvider = "MANAGOAT_PROVIDER"

// configPath is managoat's configuration file: $MANAGOAT_CONFIG, else
// $XDG_CONFIG_HOME/managoat/config, else ~/.config/managoat/config.
func configPath() string {
	if p := os.Getenv("MANAGOAT_CONFIG"); p != "" {
		return p
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "managoat", "config")
}

// defaultsFromEnv sets g's provider and mechanism from the configuration
// file (lines "provider = NAME", "mechanism = NAME", # comments), then
// the provider from MANAGOAT_PROVIDER; --provider and --mechanism still
// win. A line the file should not hold is ignored: the file is only
// defaults.
func defaultsFromEnv(g *globals) {
	if path := configPath(); path != "" {
		if b, err := os.ReadFile(path); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				k, v, ok := strings.Cut(line, "=")
				if !ok || strings.HasPrefix(strings.TrimSpace(line), "#") {
					continue
				}
				switch v = strings.TrimSpace(v); strings.TrimSpace(k) {
				case "provider":
					g.provider, g.providerChosen = v, true
				case "mechanism":
					g.mechanism = v
				}
			}
		}
	}
	if p := os.Getenv(envProvider); p != "" {
		g.provider, g.providerChosen = p, true
	}
}
