package docs

import (
	"context"
	"fmt"
	"github.com/managoat/managoat/internal/testenv"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/provider/daytona"
	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/sandbox"
)

// optional are the sandbox package's optional interfaces, by name, as
// columns of docs/contract.md's interface table. A new interface in
// package sandbox must be added here and to the table
// (TestContractNamesEveryInterface says so).
var optional = map[string]reflect.Type{
	"Checkpointer":          reflect.TypeFor[sandbox.Checkpointer](),
	"PublicURLer":           reflect.TypeFor[sandbox.PublicURLer](),
	"CreateNewer":           reflect.TypeFor[sandbox.CreateNewer](),
	"OnceDestroyer":         reflect.TypeFor[sandbox.OnceDestroyer](),
	"CheckpointOnceCreator": reflect.TypeFor[sandbox.CheckpointOnceCreator](),
	"SessionTerminator":     reflect.TypeFor[sandbox.SessionTerminator](),
	"FileReader":            reflect.TypeFor[sandbox.FileReader](),
	"FileOpener":            reflect.TypeFor[sandbox.FileOpener](),
	"FileStreamWriter":      reflect.TypeFor[sandbox.FileStreamWriter](),
	"TreeExporter":          reflect.TypeFor[sandbox.TreeExporter](),
	"HostPather":            reflect.TypeFor[sandbox.HostPather](),
	"CommandSignaler":       reflect.TypeFor[sandbox.CommandSignaler](),
	"TTYResizer":            reflect.TypeFor[sandbox.TTYResizer](),
	"SandboxCapabilities":   reflect.TypeFor[sandbox.SandboxCapabilities](),
	"PartialLister":         reflect.TypeFor[sandbox.PartialLister](),
}

// noRunners is a runner.Caller with the given runners online and no
// transport: Capabilities reads only Runners.
type noRunners struct{ rs []runner.Info }

func (c noRunners) Call(context.Context, string, *wire.Request, *runner.Subscription) (*wire.Reply, error) {
	return nil, sandbox.Unavailable("test", nil)
}
func (c noRunners) Unsubscribe(*runner.Subscription)               {}
func (c noRunners) Runners(context.Context) ([]runner.Info, error) { return c.rs, nil }

// row is one provider of the capability table: how to build it, and what
// a conditional cell (neither ✓ nor —) of its row means for it.
type row struct {
	name  string
	build func(t *testing.T) (sandbox.Provider, error)
	// cond reports, for the provider built, whether a conditional
	// capability is expected; nil: the row has no conditional cells.
	cond func(p sandbox.Provider, c sandbox.Capability) bool
}

// egressOf is provider/local's rule for network_policy and public_url:
// the mechanism constructs and guarantees the egress allow list (and,
// for public_url, can give addresses).
func egressOf(p sandbox.Provider, c sandbox.Capability) bool {
	m := p.(*local.Provider).Mechanism()
	_, upd := m.(mechanism.EgressUpdater)
	eg := upd && slices.Contains(mechanism.Constructed(m), mechanism.EgressAllowlist) &&
		slices.Contains(mechanism.Guaranteed(m), mechanism.EgressAllowlist)
	switch c {
	case sandbox.CapNetworkPolicy:
		return eg
	case sandbox.CapPublicURL:
		_, addr := m.(mechanism.Addresser)
		return eg && addr
	}
	return false
}

func localRow(label, mech string) row {
	return row{name: label, cond: egressOf, build: func(t *testing.T) (sandbox.Provider, error) {
		p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: mech})
		if err != nil {
			return nil, err
		}
		return p, nil
	}}
}

func rows() []row {
	allCaps := []string{string(sandbox.CapNetworkPolicy), string(sandbox.CapTerminateSession), string(sandbox.CapForceTerminateSession)}
	return []row{
		{name: "fake", build: func(*testing.T) (sandbox.Provider, error) { return fake.New(), nil }},
		localRow("local (trusted)", "trusted"),
		localRow("local (jail)", "jail"),
		localRow("local (oci)", "oci"),
		{name: "runner (no runner online)", build: func(*testing.T) (sandbox.Provider, error) {
			return runner.NewProvider(noRunners{}, runner.ProviderOptions{}), nil
		}},
		{name: "runner (every runner with the extras)", build: func(*testing.T) (sandbox.Provider, error) {
			return runner.NewProvider(noRunners{rs: []runner.Info{{ID: "a", Name: "a", Caps: allCaps}, {ID: "b", Name: "b", Caps: allCaps}}}, runner.ProviderOptions{}), nil
		}},
		{name: "sprites", build: func(*testing.T) (sandbox.Provider, error) {
			return sprites.New(sprites.Config{Token: "t", BaseURL: "http://127.0.0.1:1"})
		}},
		{name: "sprites (CheckpointCreationEnabled)", build: func(*testing.T) (sandbox.Provider, error) {
			return sprites.New(sprites.Config{Token: "t", BaseURL: "http://127.0.0.1:1", CheckpointCreationEnabled: true})
		}},
		{name: "e2b", build: func(*testing.T) (sandbox.Provider, error) {
			return e2b.New(e2b.Config{APIKey: "k", APIURL: "http://127.0.0.1:1"})
		}},
		{name: "daytona", build: func(*testing.T) (sandbox.Provider, error) {
			return daytona.New(daytona.Config{APIKey: "k", APIURL: "http://127.0.0.1:1"})
		}},
	}
}

// TestCapabilityTableMatchesProviders: each row of docs/contract.md's
// capability table is what that provider's Capabilities() reports: ✓ it
// has, — it has not, and a conditional cell follows the row's rule (the
// local mechanism's egress, the online runners, the sprites
// configuration). Every capability of the contract is a column.
func TestCapabilityTableMatchesProviders(t *testing.T) {
	doc := readDoc(t, "contract.md")
	header, table := table(t, doc, "provider")
	for _, c := range sandbox.KnownCapabilities() {
		if !slices.Contains(header, string(c)) {
			t.Errorf("capability %s is not a column of docs/contract.md's capability table", c)
		}
	}
	for _, r := range rows() {
		t.Run(r.name, func(t *testing.T) {
			cells, ok := table[r.name]
			if !ok {
				t.Fatalf("docs/contract.md's capability table has no row %q", r.name)
			}
			p, err := r.build(t)
			if err != nil {
				if strings.HasPrefix(r.name, "local (") && r.name != "local (trusted)" {
					// The row's cells are still checked where the
					// mechanism builds; this host cannot build it.
					testenv.Require(t, false, fmt.Sprintf("the mechanism of row %q cannot be built on this host: %v", r.name, err))
				}
				t.Fatal(err)
			}
			if c, ok := p.(interface{ Close() error }); ok {
				defer c.Close()
			}
			got := p.Capabilities()
			for _, c := range sandbox.KnownCapabilities() {
				cell := cells[string(c)]
				var want bool
				switch cell {
				case "✓":
					want = true
				case "—":
					want = false
				default:
					if r.cond == nil {
						t.Errorf("%s: cell %q for %s is conditional, but the row has no rule", r.name, cell, c)
						continue
					}
					want = r.cond(p, c)
				}
				if got.Has(c) != want {
					t.Errorf("%s: docs say %s is %q, the provider's Capabilities() %v", r.name, c, cell, got)
				}
			}
		})
	}
}

// TestInterfaceTableMatchesProviders: docs/contract.md's table of
// optional interfaces says which each provider implements, as a type
// assertion sees it.
func TestInterfaceTableMatchesProviders(t *testing.T) {
	doc := readDoc(t, "contract.md")
	header, table := table(t, doc, "implements")
	for name := range optional {
		if !slices.Contains(header, name) {
			t.Errorf("interface %s is not a column of docs/contract.md's interface table", name)
		}
	}
	for _, h := range header[1:] {
		if _, ok := optional[h]; !ok {
			t.Errorf("column %s of the interface table is no interface the test knows: add it to optional", h)
		}
	}
	types := map[string]reflect.Type{
		"fake":    reflect.TypeFor[*fake.Provider](),
		"local":   reflect.TypeFor[*local.Provider](),
		"runner":  reflect.TypeFor[*runner.Provider](),
		"sprites": reflect.TypeFor[*sprites.Provider](),
		"e2b":     reflect.TypeFor[*e2b.Provider](),
		"daytona": reflect.TypeFor[*daytona.Provider](),
	}
	for name, typ := range types {
		cells, ok := table[name]
		if !ok {
			t.Errorf("the interface table has no row %q", name)
			continue
		}
		for iname, it := range optional {
			want := cells[iname] == "✓"
			if got := typ.Implements(it); got != want {
				t.Errorf("%s: docs say %s is %q, the type implements it: %v", name, iname, cells[iname], got)
			}
		}
	}
}

// TestContractNamesEveryInterface: every exported interface of package
// sandbox, every method of Provider, every sentinel error and every
// error type is named in docs/contract.md.
func TestContractNamesEveryInterface(t *testing.T) {
	doc := readDoc(t, "contract.md")
	for _, name := range exportedInterfaces(t, "sandbox") {
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("interface sandbox.%s is not named in docs/contract.md", name)
		}
		if name != "Provider" {
			if _, ok := optional[name]; !ok {
				t.Errorf("interface sandbox.%s is not in the test's optional map (and the interface table)", name)
			}
		}
	}
	pt := reflect.TypeFor[sandbox.Provider]()
	for i := 0; i < pt.NumMethod(); i++ {
		m := pt.Method(i).Name
		if !strings.Contains(doc, "`"+m+"`") {
			t.Errorf("Provider.%s is not named in docs/contract.md", m)
		}
	}
	for _, c := range constsOf(t, "sandbox") {
		if strings.HasPrefix(c.name, "Reason") && !strings.Contains(doc, "`"+c.name+"`") {
			t.Errorf("sandbox.%s is not named in docs/contract.md", c.name)
		}
	}
	for _, e := range []error{sandbox.ErrNotFound, sandbox.ErrTruncated, sandbox.ErrNotSupported, sandbox.ErrAlreadyExists,
		sandbox.ErrCommandExited, &sandbox.RateLimitedError{}, &sandbox.UnavailableError{},
		&sandbox.DeniedError{}, &sandbox.InvalidError{}, &sandbox.RestoreFailedError{}, &sandbox.WriteFailedError{}, &sandbox.ProviderError{}} {
		kind := sandbox.Kind(e)
		if !strings.Contains(doc, "`"+kind+"`") {
			t.Errorf("kind %s (%T) is not in docs/contract.md", kind, e)
		}
		if name := strings.TrimPrefix(fmt.Sprintf("%T", e), "*sandbox."); !strings.HasPrefix(name, "*") && !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("%s is not named in docs/contract.md", name)
		}
	}
	for _, name := range []string{"ErrNotFound", "ErrTruncated", "ErrNotSupported", "ErrAlreadyExists", "ErrCommandExited"} {
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("sandbox.%s is not named in docs/contract.md", name)
		}
	}
}
