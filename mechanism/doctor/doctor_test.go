package doctor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/doctor"
	"github.com/managoat/managoat/mechanism/trusted"
)

// Example runs the doctor over the trusted mechanism, which needs nothing
// from the host, so it can run anywhere.
func Example() {
	dir, _ := os.MkdirTemp("", "doctor-example-")
	defer os.RemoveAll(dir)
	tr, _ := trusted.New(dir)
	r := doctor.Run(context.Background(), nil, tr)
	v := r.Mechanisms[0]
	fmt.Println(v.Name, "runnable:", v.Runnable, "limits refused:", len(v.LimitsMissing))
	fmt.Println("capabilities reported:", len(r.Capabilities) == len(mechanism.Known))
	// Output:
	// trusted runnable: true limits refused: 3
	// capabilities reported: true
}

func TestDefaultOnThisHost(t *testing.T) {
	testenv.RequireRoot(t)
	r, err := doctor.Default(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
	for _, m := range r.Mechanisms {
		testenv.Require(t, m.Runnable, m.Name+" cannot run on this host")
		if m.Name == "jail" {
			testenv.Require(t, len(m.LimitsMissing) == 0, fmt.Sprintf("jail limits refused: %v", m.LimitsMissing))
		}
	}
}

func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}
