package sandbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/managoat/managoat/sandbox"
)

func TestCheckNoMounts(t *testing.T) {
	if err := sandbox.CheckNoMounts("e2b", sandbox.CreateOptions{}); err != nil {
		t.Fatalf("no mounts refused: %v", err)
	}
	err := sandbox.CheckNoMounts("e2b", sandbox.CreateOptions{Mounts: []sandbox.Mount{{Source: "/src", Target: "/data", ReadOnly: true}}})
	if !errors.Is(err, sandbox.ErrNotSupported) || sandbox.Kind(err) != "not_supported" {
		t.Fatalf("err = %v, want not_supported", err)
	}
	for _, want := range []string{"e2b", "Mounts", "/src:/data:ro"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %q", err, want)
		}
	}
}
