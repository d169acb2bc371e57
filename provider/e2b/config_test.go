package e2b_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/sandbox"
)

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("E2B_API_KEY", "")
	t.Setenv("E2B_API_URL", "")
	t.Setenv("E2B_BASE_URL", "")
	if _, err := e2b.NewFromEnv(); err == nil || !strings.Contains(err.Error(), "E2B_API_KEY") {
		t.Fatalf("NewFromEnv without a key = %v, want an error naming E2B_API_KEY", err)
	}
	t.Setenv("E2B_API_KEY", "k1")
	t.Setenv("E2B_BASE_URL", "https://api.example.test")
	t.Setenv("E2B_TEMPLATE", "agent")
	t.Setenv("E2B_USER", "sprite")
	t.Setenv("E2B_SANDBOX_URL", "https://sandbox.example.test/")
	c := e2b.ConfigFromEnv()
	if c.APIKey != "k1" || c.APIURL != "https://api.example.test" || c.Template != "agent" || c.User != "sprite" || c.SandboxURL != "https://sandbox.example.test/" {
		t.Fatalf("ConfigFromEnv = %+v", c)
	}
	t.Setenv("E2B_API_URL", "https://api.other.test")
	if c := e2b.ConfigFromEnv(); c.APIURL != "https://api.other.test" {
		t.Fatalf("E2B_API_URL does not win over E2B_BASE_URL: %s", c.APIURL)
	}
	p, err := e2b.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Name() != "e2b" || !p.Capabilities().Has(sandbox.CapAttach) || p.Capabilities().Has(sandbox.CapPublicURL) {
		t.Fatalf("%s %v", p.Name(), p.Capabilities())
	}
	if _, err := e2b.New(e2b.Config{}); !errors.Is(err, e2b.ErrNoAPIKey) {
		t.Fatalf("New(Config{}) = %v", err)
	}
}

func TestEnvelopeReader(t *testing.T) {
	var b []byte
	b = e2b.AppendEnvelope(b, e2b.FlagMessage, []byte(`{"a":1}`))
	b = e2b.AppendEnvelope(b, e2b.FlagEndStream, []byte(`{}`))
	// Delivered one byte at a time, the reader still sees whole envelopes.
	r := e2b.NewEnvelopeReader(io.MultiReader(oneByte(b)...))
	f, p, err := r.Next()
	if err != nil || f != 0 || string(p) != `{"a":1}` {
		t.Fatalf("first %d %q %v", f, p, err)
	}
	f, p, err = r.Next()
	if err != nil || f != 2 || string(p) != `{}` {
		t.Fatalf("second %d %q %v", f, p, err)
	}
	if _, _, err = r.Next(); err != io.EOF {
		t.Fatalf("end = %v, want EOF", err)
	}
	for _, cut := range []int{1, 4, 5, 9} {
		r := e2b.NewEnvelopeReader(bytes.NewReader(b[:cut]))
		if _, _, err := r.Next(); err != io.ErrUnexpectedEOF {
			t.Fatalf("cut at %d: %v, want ErrUnexpectedEOF", cut, err)
		}
	}
	huge := []byte{0, 0xff, 0xff, 0xff, 0xff}
	if _, _, err := e2b.NewEnvelopeReader(bytes.NewReader(huge)).Next(); err == nil {
		t.Fatal("an oversize envelope was accepted")
	}
}

func oneByte(b []byte) []io.Reader {
	rs := make([]io.Reader, len(b))
	for i := range b {
		rs[i] = bytes.NewReader(b[i : i+1])
	}
	return rs
}
