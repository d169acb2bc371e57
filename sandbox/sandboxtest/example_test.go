package sandboxtest_test

import (
	"testing"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// A provider's own test calls Run with fixtures its sandboxes can run.
// Providers with a POSIX shell use ShellFixtures.
func ExampleRun() {
	emit := func(args ...string) sandbox.Cmd { return sandbox.Cmd{Name: "emit", Args: args} }
	fx := sandboxtest.Fixtures{
		ExecOK: emit("out:hello"), ExecOKWant: "hello",
		ExecFail: emit("exit:3"), ExecFailCode: 3,
		SpawnOK:   emit("out:hello"),
		SpawnDrop: emit("out:partial", "drop"),
		SpawnStay: emit("out:ready", "stay"),
		Stderr:    emit("err:warning"), StderrWant: "warning",
		EnvDir: emit("env:MANAGOAT_CONFORMANCE", "pwd"),
		Slow:   emit("out:tick", "sleep:10s"),
	}
	testConformance := func(t *testing.T) {
		p := fake.New()
		defer p.Close()
		sandboxtest.Run(t, p, fx)
	}
	_ = testConformance
}
