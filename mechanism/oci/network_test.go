package oci_test

import (
	"testing"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
	"github.com/managoat/managoat/mechanism/oci"
)

// factoryNet is factory with egress to the stand-in internet in.
func factoryNet(runtime string, in *egresstest.Internet) func(t *testing.T) mechanism.Mechanism {
	return func(t *testing.T) mechanism.Mechanism {
		m, err := oci.New(oci.Config{Runtime: runtime, StateDir: t.TempDir(), Egress: egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}
