package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// The platform runs sandboxes elsewhere: a Create with host mounts is
// refused by name before any request (the URL here answers nothing).
func TestCreateRefusesMounts(t *testing.T) {
	c, err := client.New(client.Options{URL: "http://127.0.0.1:1", APIKey: "mgk_test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Create(context.Background(), "box", sandbox.CreateOptions{Mounts: []sandbox.Mount{{Source: "/srv", Target: "/data"}}})
	if !errors.Is(err, sandbox.ErrNotSupported) || !strings.Contains(err.Error(), "provider platform cannot bind host paths") {
		t.Fatalf("Create with mounts: %v", err)
	}
}
