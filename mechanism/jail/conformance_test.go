package jail_test

import (
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/mechanismtest"
)

func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	mechanismtest.Run(t, func(t *testing.T) mechanism.Mechanism {
		j, err := jail.New(jail.Config{StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}, mechanismtest.Strict(testenv.InCI()))
}
