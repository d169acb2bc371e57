package sandboxtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// envMutant selects the wrong adapter TestMutant runs the suite against.
const envMutant = "MANAGOAT_SANDBOXTEST_MUTANT"

var emit = func(args ...string) sandbox.Cmd { return sandbox.Cmd{Name: "emit", Args: args} }

var fakeFixtures = sandboxtest.Fixtures{
	ExecOK: emit("out:hello"), ExecOKWant: "hello",
	ExecFail: emit("out:oops", "exit:3"), ExecFailCode: 3,
	SpawnOK:   emit("out:hello", "exit:0"),
	SpawnDrop: emit("out:partial", "drop"),
	SpawnStay: emit("out:ready", "stay"),
	Stderr:    emit("out:x", "err:warning"), StderrWant: "warning",
	EnvDir:  emit("env:MANAGOAT_CONFORMANCE", "out:\n", "pwd"),
	Slow:    emit("out:tick", "sleep:10s", "out:done"),
	Connect: func(addr string) sandbox.Cmd { return emit("connect:" + addr) },
}

// Wrong adapters: provider/fake with one fault each.
type (
	policyIgnored    struct{ *fake.Provider } // accepts a policy, enforces none
	createAnew       struct{ *fake.Provider } // Create of an existing name makes it anew
	publicURLError   struct{ *fake.Provider } // advertises public_url, answers an error
	missingIsOther   struct{ *fake.Provider } // a missing sandbox's Exec is unavailable
	suspendNoop      struct{ *fake.Provider } // advertises suspend, does nothing
	onceUnadvertise  struct{ *fake.Provider } // checkpoints once without advertising it
	claimsCheckpoint struct{ *fake.Provider } // advertises checkpoint, implements no Checkpointer
)

func (p claimsCheckpoint) Capabilities() sandbox.Capabilities {
	return p.Provider.Capabilities().With(sandbox.CapCheckpoint)
}

func (p policyIgnored) ApplyNetworkPolicy(context.Context, *sandbox.Handle, sandbox.NetworkPolicy) error {
	return nil
}

func (p createAnew) Create(ctx context.Context, name string, o sandbox.CreateOptions) (*sandbox.Handle, error) {
	_ = p.Provider.Destroy(ctx, sandbox.BuildHandle(fake.Name, name))
	return p.Provider.Create(ctx, name, o)
}

func (p publicURLError) PublicURL(context.Context, *sandbox.Handle) (string, error) {
	return "", &sandbox.ProviderError{Provider: fake.Name, Reason: "boom", Err: errors.New("internal error")}
}

func (p missingIsOther) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, o sandbox.ExecOptions) (sandbox.ExecResult, error) {
	r, err := p.Provider.Exec(ctx, h, c, o)
	if errors.Is(err, sandbox.ErrNotFound) {
		return r, sandbox.Unavailable("exec", errors.New(err.Error())) // "not found" collapsed into transient
	}
	return r, err
}

func (p suspendNoop) Suspend(context.Context, *sandbox.Handle) error { return nil }

func (p onceUnadvertise) CreateCheckpointOnce(ctx context.Context, h *sandbox.Handle, o sandbox.CheckpointOnceOptions) (string, error) {
	return "cp-" + o.OperationID, nil
}

var mutants = map[string]struct {
	wrap  func(*fake.Provider) sandbox.Provider
	case_ string // the case that must fail, Group/Case
}{
	"policy_ignored":     {func(f *fake.Provider) sandbox.Provider { return policyIgnored{f} }, "Governance/EmptyAllowlistAccepted"},
	"create_anew":        {func(f *fake.Provider) sandbox.Provider { return createAnew{f} }, "Lifecycle/CreateAdopts"},
	"public_url_error":   {func(f *fake.Provider) sandbox.Provider { return publicURLError{f} }, "Identity/PublicURLAgreesWithCapability"},
	"missing_is_other":   {func(f *fake.Provider) sandbox.Provider { return missingIsOther{f} }, "Lifecycle/MissingSandboxIsNotFound"},
	"suspend_noop":       {func(f *fake.Provider) sandbox.Provider { return suspendNoop{f} }, "Lifecycle/SuspendResumeAreTotal"},
	"once_unadvertised":  {func(f *fake.Provider) sandbox.Provider { return onceUnadvertise{f} }, "Lifecycle/UnimplementedOptionalsAreNotSupported"},
	"checkpoint_claimed": {func(f *fake.Provider) sandbox.Provider { return claimsCheckpoint{f} }, "Identity/CapabilitiesMatchInterfaces"},
	"none (the control)": {func(f *fake.Provider) sandbox.Provider { return f }, ""},
}

// TestMutant runs the suite against the wrong adapter envMutant names (run
// by TestWrongAdaptersFail in a child process; skipped otherwise).
func TestMutant(t *testing.T) {
	m, ok := mutants[os.Getenv(envMutant)]
	if !ok {
		t.Skip(envMutant + " names no mutant: this runs in TestWrongAdaptersFail's child")
	}
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	sandboxtest.Run(t, m.wrap(f), fakeFixtures, sandboxtest.WithTimeout(2*time.Second))
}

// TestWrongAdaptersFail: each strengthened case fails an adapter that is
// wrong in the way it is about (issue 42's cases that passed too easily),
// and the correct fake passes the same cases. Each mutant passes every
// case on the old suite (run against it: all six passed): the policies were
// only applied, CreateAdopts compared names, PublicURL had no default
// case, MissingSandboxIsNotFound took any error, SuspendResumeAreTotal
// never asked for the status, and CreateCheckpointOnce was not observed.
func TestWrongAdaptersFail(t *testing.T) {
	if os.Getenv(envMutant) != "" {
		t.Skip("in the child")
	}
	for name, m := range mutants {
		t.Run(name, func(t *testing.T) {
			run := "^TestMutant$/^(Identity|Lifecycle|Governance)$/^(EmptyAllowlistAccepted|CreateAdopts|CapabilitiesMatchInterfaces|PublicURLAgreesWithCapability|MissingSandboxIsNotFound|SuspendResumeAreTotal|UnimplementedOptionalsAreNotSupported)$"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), envMutant+"="+name)
			out, err := cmd.CombinedOutput()
			failed := strings.Count(string(out), "--- FAIL: TestMutant/")
			if m.case_ == "" {
				if err != nil {
					t.Fatalf("the correct fake fails the strengthened cases: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !strings.Contains(string(out), "--- FAIL: TestMutant/"+m.case_+" ") {
				t.Fatalf("the wrong adapter %s passed %s (%v):\n%s", name, m.case_, err, out)
			}
			// Only its own case (and the groups holding it) fail.
			if failed != 2 {
				t.Errorf("%d failures for %s, want its case and its group:\n%s", failed, name, out)
			}
		})
	}
}
