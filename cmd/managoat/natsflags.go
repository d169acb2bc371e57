package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/managoat/managoat/provider/runner/natshost"
)

// Environment of a platform's NATS connection and cluster key (the flags
// of the same names default to them).
const (
	envClusterKey     = "MANAGOAT_CLUSTER_KEY" // the key's text itself; taken out of the environment once read
	envClusterKeyFile = "MANAGOAT_CLUSTER_KEY_FILE"
	envNATSCreds      = "MANAGOAT_NATS_CREDS"
	envNATSNKey       = "MANAGOAT_NATS_NKEY"
	envNATSTLSCert    = "MANAGOAT_NATS_TLS_CERT"
	envNATSTLSKey     = "MANAGOAT_NATS_TLS_KEY"
	envNATSTLSCA      = "MANAGOAT_NATS_TLS_CA"
)

// natsOptions are serve's settings of its NATS connection (how the
// replica authenticates to the server) and the platform's cluster key.
type natsOptions struct {
	keyFile, creds, nkey, tlsCert, tlsKey, tlsCA string

	key  natshost.ClusterKey // read by load
	opts []nats.Option       // read by load
}

// addNATSFlags defines serve's NATS flags on fs.
func addNATSFlags(fs *flag.FlagSet) *natsOptions {
	o := &natsOptions{}
	fs.StringVar(&o.keyFile, "cluster-key-file", os.Getenv(envClusterKeyFile), "with --nats, a file (mode 600) holding the cluster key, the same secret on every replica and nowhere else (base64 or hex, at least 32 bytes: openssl rand -base64 48), which seals every message between replicas; or the key itself in $"+envClusterKey+" (default $"+envClusterKeyFile+")")
	fs.StringVar(&o.creds, "nats-creds", os.Getenv(envNATSCreds), "with --nats, a NATS credentials file (user JWT and nkey seed) the replica authenticates with (default $"+envNATSCreds+")")
	fs.StringVar(&o.nkey, "nats-nkey", os.Getenv(envNATSNKey), "with --nats, a file holding the replica's NATS nkey seed (SU...) it authenticates with (default $"+envNATSNKey+")")
	fs.StringVar(&o.tlsCert, "nats-tls-cert", os.Getenv(envNATSTLSCert), "with --nats, a client certificate (PEM, with --nats-tls-key) for mutual TLS with the NATS server (default $"+envNATSTLSCert+")")
	fs.StringVar(&o.tlsKey, "nats-tls-key", os.Getenv(envNATSTLSKey), "the NATS client certificate's private key (PEM; default $"+envNATSTLSKey+")")
	fs.StringVar(&o.tlsCA, "nats-tls-ca", os.Getenv(envNATSTLSCA), "with --nats, the CA certificate(s) (PEM) the NATS server's certificate must chain to; TLS is then required (default $"+envNATSTLSCA+")")
	return o
}

// load reads the cluster key and the connection's options, when natsURL
// is set; the key's variable is taken out of the environment whatever
// happens. A platform of several replicas without a cluster key is
// refused: every NATS user could then run commands on every runner.
func (o *natsOptions) load(natsURL string) error {
	text, inEnv := os.LookupEnv(envClusterKey)
	os.Unsetenv(envClusterKey)
	if natsURL == "" {
		return nil
	}
	var err error
	switch {
	case inEnv && text != "" && o.keyFile != "":
		return usageError{msg: "--cluster-key-file and " + envClusterKey + " both set: give the cluster key once"}
	case inEnv && text != "":
		if o.key, err = natshost.ParseKey(text); err != nil {
			return usageError{msg: envClusterKey + ": " + err.Error()}
		}
	case o.keyFile != "":
		if o.key, err = natshost.ReadKeyFile(o.keyFile); err != nil {
			return usageError{msg: "--cluster-key-file: " + err.Error()}
		}
	default:
		return usageError{msg: "--nats needs the platform's cluster key (--cluster-key-file, or " + envClusterKey + "): the same secret on every replica, which seals their messages so that another NATS user can neither read nor forge them (make one with: openssl rand -base64 48)"}
	}
	if o.creds != "" && o.nkey != "" {
		return usageError{msg: "--nats-creds and --nats-nkey: give one"}
	}
	if o.creds != "" {
		o.opts = append(o.opts, nats.UserCredentials(o.creds))
	}
	if o.nkey != "" {
		opt, err := nats.NkeyOptionFromSeed(o.nkey)
		if err != nil {
			return usageError{msg: fmt.Sprintf("--nats-nkey %s: %v", o.nkey, err)}
		}
		o.opts = append(o.opts, opt)
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return usageError{msg: "--nats-tls-cert and --nats-tls-key go together"}
	}
	if o.tlsCert != "" {
		o.opts = append(o.opts, nats.ClientCert(o.tlsCert, o.tlsKey))
	}
	if o.tlsCA != "" {
		o.opts = append(o.opts, nats.RootCAs(o.tlsCA))
	}
	return nil
}
