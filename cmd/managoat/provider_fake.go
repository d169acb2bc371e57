package main

import (
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// The fake lives in this process only: useful with `run`, and for trying
// the CLI without a kernel sandbox.
func init() {
	registerProvider("fake", func() (sandbox.Provider, error) { return fake.New(), nil })
}
