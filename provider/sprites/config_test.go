package sprites_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/sandbox"
)

func TestConfigDefaults(t *testing.T) {
	p, err := sprites.New(sprites.Config{Token: "tok"})
	ok(t, err)
	c := p.Config()
	if c.BaseURL != sprites.DefaultBaseURL || c.Timeout != 30*time.Second || c.CreateTimeout != 120*time.Second ||
		c.PolicyTimeout != 90*time.Second || c.PublicURLs == nil || !*c.PublicURLs || c.CheckpointCreationEnabled || c.Logger == nil {
		t.Fatalf("defaults %v", c)
	}
	p, err = sprites.New(sprites.Config{Token: "tok", BaseURL: "http://127.0.0.1:9/api/", Timeout: time.Second,
		PolicyTimeout: 2 * time.Second, PublicURLs: sprites.Bool(false), CheckpointCreationEnabled: true})
	ok(t, err)
	c = p.Config()
	if c.BaseURL != "http://127.0.0.1:9/api" || c.Timeout != time.Second || c.PolicyTimeout != 2*time.Second || *c.PublicURLs ||
		!c.CheckpointCreationEnabled {
		t.Fatalf("explicit %v", c)
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := sprites.New(sprites.Config{})
	if err == nil || !strings.Contains(err.Error(), "SPRITES_TOKEN") {
		t.Fatalf("missing token: %v", err)
	}
	for _, u := range []string{"ftp://x", "api.sprites.dev", "http://", "://"} {
		if _, err := sprites.New(sprites.Config{Token: "t", BaseURL: u}); err == nil {
			t.Fatalf("base URL %q accepted", u)
		}
	}
}

func TestFromEnv(t *testing.T) {
	for _, k := range []string{sprites.EnvToken, sprites.EnvAPIURL, sprites.EnvBaseURL, sprites.EnvTimeoutMS, sprites.EnvPublicURLs, sprites.EnvCheckpointCreationEnabled} {
		t.Setenv(k, "")
	}
	_, err := sprites.NewFromEnv()
	if err == nil || !strings.Contains(err.Error(), "SPRITES_TOKEN") {
		t.Fatalf("no token: %v", err)
	}
	t.Setenv(sprites.EnvToken, "envtok")
	p, err := sprites.NewFromEnv()
	ok(t, err)
	if c := p.Config(); c.Token != "envtok" || c.BaseURL != sprites.DefaultBaseURL || c.Timeout != sprites.DefaultTimeout {
		t.Fatalf("defaults from env %v", c)
	}
	t.Setenv(sprites.EnvBaseURL, "http://127.0.0.1:2")
	p, err = sprites.NewFromEnv()
	ok(t, err)
	if p.Config().BaseURL != "http://127.0.0.1:2" {
		t.Fatal("SPRITES_BASE_URL not read")
	}
	t.Setenv(sprites.EnvAPIURL, "http://127.0.0.1:1")
	t.Setenv(sprites.EnvTimeoutMS, "1500")
	t.Setenv(sprites.EnvPublicURLs, "false")
	t.Setenv(sprites.EnvCheckpointCreationEnabled, "true")
	p, err = sprites.NewFromEnv()
	ok(t, err)
	if c := p.Config(); c.BaseURL != "http://127.0.0.1:1" || c.Timeout != 1500*time.Millisecond || *c.PublicURLs || !c.CheckpointCreationEnabled {
		t.Fatalf("env %v", c)
	}
	if !p.Capabilities().Has(sandbox.CapCheckpoint) {
		t.Fatal("flag from env not applied")
	}
	for k, v := range map[string]string{sprites.EnvTimeoutMS: "soon", sprites.EnvPublicURLs: "maybe", sprites.EnvCheckpointCreationEnabled: "2"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			if _, err := sprites.FromEnv(); err == nil || !strings.Contains(err.Error(), k) {
				t.Fatalf("%s=%s: %v", k, v, err)
			}
		})
	}
}

// TestNoTokenLeak: neither a handle (with its Private state), nor the
// provider, nor its Config, nor an error ever shows the token.
func TestNoTokenLeak(t *testing.T) {
	const secret = "sk-very-secret-token"
	srv, _ := newFake(t, sprites.Config{})
	p, err := sprites.New(sprites.Config{Token: secret, BaseURL: srv.URL})
	ok(t, err)
	ctx := ctxT(t)
	// The fake wants its own token, so this is a 401: check the error too.
	_, err = p.Create(ctx, "leak", sandbox.CreateOptions{})
	var de *sandbox.DeniedError
	if !errors.As(err, &de) {
		t.Fatalf("create with a wrong token = %v", err)
	}
	_, good := newFake(t, sprites.Config{})
	h, err := good.Create(ctx, "leak", sandbox.CreateOptions{})
	ok(t, err)
	if h.Private == nil {
		t.Fatal("Create should carry private state")
	}
	tok := good.Config().Token
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	log.Info("h", "handle", h, "private", h.Private, "cfg", good.Config(), "provider", good)
	log.Info("p", "cfg", p.Config())
	js, _ := json.Marshal(h)
	cj, _ := json.Marshal(p.Config())
	var out strings.Builder
	for _, v := range []any{h, *h, h.Private, p, p.Config(), good, good.Config(), err} {
		fmt.Fprintf(&out, "%v|%+v|%#v|%s|", v, v, v, v)
	}
	out.Write(js)
	out.Write(cj)
	out.Write(logs.Bytes())
	for _, s := range []string{secret, tok} {
		if strings.Contains(out.String(), s) {
			t.Fatalf("token %q leaked in: %s", s, out.String())
		}
	}
}
