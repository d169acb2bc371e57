package mechanismtest_test

import (
	"testing"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/mechanismtest"
	"github.com/managoat/managoat/mechanism/trusted"
)

// A mechanism's own test calls Run with a factory that gives each check a
// fresh mechanism. Strict(true) makes "not demonstrated" a failure: the
// jail's test sets it under CI=true, where every guarantee must be
// observed; trusted claims no isolation, so it runs without it.
func ExampleRun() {
	testConformance := func(t *testing.T) {
		mechanismtest.Run(t, func(t *testing.T) mechanism.Mechanism {
			m, err := trusted.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return m
		}, mechanismtest.Strict(false))
	}
	_ = testConformance
}
