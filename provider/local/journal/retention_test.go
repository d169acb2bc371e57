package journal

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// Select prunes finished journals only, oldest first, until the size
// bound holds, and every finished one past the age bound.
func TestRetentionSelect(t *testing.T) {
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	es := []Entry{
		{ID: "s1", Size: 100, Ended: ago(3 * time.Hour)},
		{ID: "s2", Size: 100, Ended: ago(2 * time.Hour)},
		{ID: "s3", Size: 500}, // running: never pruned, still counted
		{ID: "s4", Size: 100, Ended: ago(time.Hour)},
	}
	for _, tc := range []struct {
		r    Retention
		want []string
	}{
		{Retention{}, nil},
		{Retention{MaxBytes: 800}, nil},
		{Retention{MaxBytes: 700}, []string{"s1"}},
		{Retention{MaxBytes: 650}, []string{"s1", "s2"}},
		{Retention{MaxBytes: 100}, []string{"s1", "s2", "s4"}}, // the running one alone is over: all finished go
		{Retention{MaxAge: 90 * time.Minute}, []string{"s1", "s2"}},
		{Retention{MaxBytes: 700, MaxAge: 150 * time.Minute}, []string{"s1"}},
	} {
		got, why := tc.r.Select(es, now)
		if !slices.Equal(got, tc.want) || len(why) != len(got) {
			t.Errorf("%+v: pruned %v (%q), want %v", tc.r, got, why, tc.want)
		}
		for _, w := range why {
			if !strings.Contains(w, "limit") {
				t.Errorf("%+v: why %q names no limit", tc.r, w)
			}
		}
	}
}
