package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, PEM, into dir.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "managoat test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestServeOverTLS: serve with --tls-cert/--tls-key; a runner and a client
// that trust the certificate (SSL_CERT_FILE) run a command through it over
// wss and https.
func TestServeOverTLS(t *testing.T) {
	testenv.RequireRoot(t)
	cert, key := selfSigned(t, t.TempDir())
	if _, e, code := managoatEnv(t, nil, "serve", "--tls-cert", cert); code != exitUsage || !strings.Contains(e, "go together") {
		t.Fatalf("--tls-cert alone: %d %s", code, e)
	}
	addr := freeAddr(t)
	home := t.TempDir()
	env := []string{"MANAGOAT_HOME=" + home, "MANAGOAT_RUNNER_TOKEN=tok-tls", "MANAGOAT_URL=https://" + addr, "SSL_CERT_FILE=" + cert}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(extra []string, args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, binary, args...)
		c.Env = append(append(os.Environ(), env...), extra...)
		c.Cancel = func() error { return c.Process.Signal(os.Interrupt) }
		c.WaitDelay = 10 * time.Second
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	serve := start(nil, "serve", "--listen", addr, "--tls-cert", cert, "--tls-key", key)
	defer serve.Wait()
	secret, e, code := managoatEnv(t, env, "enroll", "tls")
	if code != 0 {
		t.Fatalf("enroll: %s", e)
	}
	cred := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(cred, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	rn := start([]string{"MANAGOAT_RUNNER_TOKEN="}, "runner", "--url", "https://"+addr, "--name", "tls", "--token-file", cred)
	defer rn.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, e, code := managoatEnv(t, env, "--provider", "runner", "run", "--", "echo", "over tls")
		if code == 0 && out == "over tls\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run over TLS: exit %d stdout %q stderr %q", code, out, e)
		}
		time.Sleep(200 * time.Millisecond) // polling for the runner to connect
	}
	// Without trusting the certificate, the client refuses the server.
	plain := []string{"MANAGOAT_HOME=" + home, "MANAGOAT_RUNNER_TOKEN=tok-tls", "MANAGOAT_URL=https://" + addr, "SSL_CERT_FILE=/dev/null"}
	if _, e, code := managoatEnv(t, plain, "--provider", "runner", "run", "--", "true"); code == 0 {
		t.Fatalf("a client that does not trust the certificate ran a command: %s", e)
	}
	cancel()
}
