package natshost_test

import (
	"context"
	"log"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
)

// One replica of a platform: its runner endpoint registers runners
// cluster-wide, and its provider reaches every replica's runners.
func ExampleNew() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	key, err := natshost.ReadKeyFile("/etc/managoat/cluster.key") // the same on every replica
	if err != nil {
		log.Fatal(err)
	}
	h, err := natshost.New(ctx, natshost.Config{Conn: nc, ClusterKey: key})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	srv := runner.NewServer(runner.ServerConfig{Auth: runner.StaticToken("key"), Host: h})
	http.Handle("/api/runners", srv)
	http.Handle("/api/runners/", srv)
	p := runner.NewProvider(h, runner.ProviderOptions{})
	_ = p // a sandbox.Provider for the platform's API
}
