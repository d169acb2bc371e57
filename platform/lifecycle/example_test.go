package lifecycle_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/sqlite"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// An hour after its last use, a sandbox is parked by the next pass.
func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "lifecycle")
	defer os.RemoveAll(dir)
	st, _ := sqlite.Open(ctx, filepath.Join(dir, "platform.db"))
	defer st.Close()
	env := map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"}
	pol, _ := policy.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, policy.Options{Extra: []string{"fake"}})
	f := fake.New()
	defer f.Close()
	srv, _ := api.New(api.Config{Store: st, Policy: pol, Providers: map[string]sandbox.Provider{"fake": f}})
	defer srv.Close()
	acct, _ := st.CreateAccount(ctx, "alice")
	if _, _, err := srv.Create(ctx, acct.ID, "box", "", sandbox.Limits{}, nil, false, 0); err != nil {
		panic(err)
	}

	m := lifecycle.New(lifecycle.Config{Store: st, API: srv, Idle: 15 * time.Minute,
		Now: func() time.Time { return time.Now().Add(time.Hour) }})
	r := m.Pass(ctx)
	rec, _ := st.GetSandbox(ctx, acct.ID, "box")
	fmt.Println(r.Parked, rec.State == store.StateParked, rec.ParkedBy)
	// Output: 1 true suspend
}
