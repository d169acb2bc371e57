package natshost_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/managoat/managoat/provider/runner/natshost"
)

// TestShippedLocalNATSConfig: deploy/nats/nats-local.conf (what
// deploy/local-cluster.sh runs) listens on loopback only, with nothing
// else listening (no routes, leaf nodes or monitoring), and refuses a
// client without the replicas' password or with a wrong one; with it, a
// replica joins (JetStream in the replicas' own account).
func TestShippedLocalNATSConfig(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	t.Setenv("NATS_PORT", strconv.Itoa(port))
	t.Setenv("NATS_STORE_DIR", t.TempDir())
	t.Setenv("MANAGOAT_NATS_PASSWORD", "a-long-random-password")
	opts, err := server.ProcessConfigFile("../../../deploy/nats/nats-local.conf")
	if err != nil {
		t.Fatal(err)
	}
	if opts.Host != "127.0.0.1" || opts.Cluster.Port != 0 || opts.LeafNode.Port != 0 || opts.HTTPPort != 0 || opts.Gateway.Port != 0 || opts.NoAuthUser != "" {
		t.Fatalf("nats-local.conf: host %q, cluster %d, leaf %d, http %d, gateway %d, no_auth_user %q; want loopback alone, and no anonymous user",
			opts.Host, opts.Cluster.Port, opts.LeafNode.Port, opts.HTTPPort, opts.Gateway.Port, opts.NoAuthUser)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	for _, o := range [][]nats.Option{nil, {nats.UserInfo("managoat", "wrong")}, {nats.UserInfo("other", "a-long-random-password")}} {
		if nc, err := nats.Connect(url, append(o, nats.NoReconnect())...); err == nil {
			nc.Close()
			t.Fatalf("a client with %d options and not the replicas' credentials connected", len(o))
		}
	}
	nc, err := nats.Connect(url, nats.UserInfo("managoat", "a-long-random-password"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := natshost.New(ctx, natshost.Config{Conn: nc, Replica: "a", Logger: quiet, ClusterKey: clusterKey})
	if err != nil {
		t.Fatalf("a replica with the password: %v", err)
	}
	h.Close()
}

// TestShippedClusterNATSConfig: deploy/nats/nats-cluster.conf binds
// clients and routes to the address given (never all interfaces),
// requires client certificates (mutual TLS) and an nkey from every
// client, and checks every route's certificate.
func TestShippedClusterNATSConfig(t *testing.T) {
	dir := t.TempDir()
	writeTestCerts(t, dir, "ca", "server", "route")
	conf, err := os.ReadFile("../../../deploy/nats/nats-cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(conf), "/etc/nats/", dir+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	t.Setenv("NATS_NAME", "nats-1")
	t.Setenv("NATS_HOST", "10.1.2.3")
	t.Setenv("MANAGOAT_NATS_REPLICA_KEY", pub)
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Host != "10.1.2.3" || opts.Cluster.Host != "10.1.2.3" || opts.NoAuthUser != "" {
		t.Fatalf("nats-cluster.conf: clients on %q, routes on %q, no_auth_user %q; want the private address given, no anonymous user", opts.Host, opts.Cluster.Host, opts.NoAuthUser)
	}
	if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert || opts.Cluster.TLSConfig == nil || opts.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("nats-cluster.conf: clients or routes without TLS that checks the peer's certificate: %v %v %v", opts.TLSVerify, opts.TLSConfig != nil && opts.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert, opts.Cluster.TLSConfig != nil && opts.Cluster.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert)
	}
	if len(opts.Nkeys) != 1 || opts.Nkeys[0].Nkey != pub || len(opts.Users) != 0 {
		t.Fatalf("nats-cluster.conf: clients authenticate by %d nkeys and %d passwords, want the replicas' nkey alone", len(opts.Nkeys), len(opts.Users))
	}
}

// writeTestCerts writes a CA (NAME.pem) and certificates signed by it
// (NAME.pem, NAME.key) into dir.
func writeTestCerts(t *testing.T, dir, ca string, names ...string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(ca+".pem", "CERTIFICATE", caDER)
	caCert, _ := x509.ParseCertificate(caDER)
	for i, n := range names {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: n}, DNSNames: []string{n},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(k)
		write(n+".pem", "CERTIFICATE", der)
		write(n+".key", "EC PRIVATE KEY", kder)
	}
}
