package doctor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/doctor"
)

// The doctor tries the home quota once and says how it went.
func TestHomeQuotaReported(t *testing.T) {
	testenv.RequireRoot(t)
	r, err := doctor.Default(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	q := r.HomeQuota
	if q == nil || q.Detail == "" {
		t.Fatalf("HomeQuota = %+v", q)
	}
	if q.Method != "" && !strings.Contains(q.Detail, "tried") {
		t.Fatalf("a method without the evidence of a try: %+v", q)
	}
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "home disk quota (jail, runc; --disk): ") {
		t.Fatalf("no home quota line in:\n%s", b.String())
	}
	t.Logf("%+v", q)
}
