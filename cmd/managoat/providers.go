package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/managoat/managoat/sandbox"
)

// providerBuilders holds the providers this binary can use, by name. Each
// provider file registers itself in an init function; a builder runs only
// when its provider is asked for, so a missing credential is an error only
// for the provider that needs it.
var (
	buildersMu       sync.Mutex
	providerBuilders = map[string]func() (sandbox.Provider, error){}
)

func registerProvider(name string, build func() (sandbox.Provider, error)) {
	buildersMu.Lock()
	defer buildersMu.Unlock()
	providerBuilders[name] = build
}

func providerNames() []string {
	buildersMu.Lock()
	defer buildersMu.Unlock()
	names := make([]string, 0, len(providerBuilders))
	for n := range providerBuilders {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// openProvider builds the named provider and returns a registry holding it.
func openProvider(name string) (*sandbox.Registry, sandbox.Provider, error) {
	buildersMu.Lock()
	build, ok := providerBuilders[name]
	buildersMu.Unlock()
	noteLocalFallback(name) // platform.go
	if !ok {
		return nil, nil, &sandbox.InvalidError{Reason: sandbox.ReasonProvider,
			Msg: fmt.Sprintf("unknown provider %q — known: %s", name, strings.Join(providerNames(), ", "))}
	}
	p, err := build()
	if err != nil {
		if sandbox.Kind(err) == "unknown" {
			// A provider that cannot be built is misconfigured (an unknown
			// mechanism, a missing credential): the caller's to fix.
			err = &sandbox.InvalidError{Reason: "provider_config", Msg: err.Error()}
		}
		return nil, nil, fmt.Errorf("provider %s: %w", name, err)
	}
	if signalsReady != nil {
		<-signalsReady // Ctrl-C is caught before the command acts
	}
	if c, ok := p.(io.Closer); ok {
		openedMu.Lock()
		opened = append(opened, c)
		openedMu.Unlock()
	}
	return sandbox.NewRegistry(p), p, nil
}

// opened are the providers a command opened that have a Close; run closes
// them when the command ends, before the process exits: a provider may
// finish work there that the command started (E2B kills a timed-out
// exec's process tree in the background, and its Close waits for that).
var (
	openedMu sync.Mutex
	opened   []io.Closer
)

// noteOnce writes a line about what managoat is doing that the user may
// not expect (a fallback, a default taken, no isolation) to stderr, once
// per process however often it is asked.
func noteOnce(msg string) {
	notedMu.Lock()
	defer notedMu.Unlock()
	if noted[msg] {
		return
	}
	noted[msg] = true
	fmt.Fprintln(os.Stderr, "managoat: note: "+msg)
}

var (
	notedMu sync.Mutex
	noted   = map[string]bool{}
)

// closeProviders closes what openProvider opened and forgets it.
func closeProviders() {
	openedMu.Lock()
	cs := opened
	opened = nil
	openedMu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
}
