package oci_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/oci"
)

// benchMechs returns the jail (the baseline), oci/runc and oci/runsc.
func benchMechs(b *testing.B) []mechanism.Mechanism {
	requireRuntime(b, "runc")
	requireRuntime(b, "runsc")
	j, err := jail.New(jail.Config{StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ms := []mechanism.Mechanism{j}
	for _, rt := range []string{"runc", "runsc"} {
		m, err := oci.New(oci.Config{Runtime: rt, StateDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		ms = append(ms, m)
	}
	return ms
}

func report(b *testing.B, ms []mechanism.Mechanism, per []time.Duration, unit string) {
	for i, m := range ms {
		b.ReportMetric(float64(per[i].Microseconds())/1000, "ms-"+unit+"/"+m.Name())
	}
	for i := 1; i < len(ms); i++ {
		b.ReportMetric(float64(per[i])/float64(per[0]), "x-jail/"+ms[i].Name())
	}
}

// BenchmarkStartToFirstOutput: Provision, Start, then Execute of `echo hi`
// until its first output chunk arrives, per mechanism, in the same loop;
// the ratios are against the jail. The steps are reported too (each OCI
// step is one runtime invocation: create, start, exec).
func BenchmarkStartToFirstOutput(b *testing.B) {
	ms := benchMechs(b)
	ctx := context.Background()
	total := make([]time.Duration, len(ms))
	steps := make([][3]time.Duration, len(ms))
	n := 0
	for b.Loop() {
		for i, m := range ms {
			id := fmt.Sprintf("sf%d", n)
			t0 := time.Now()
			if err := m.Provision(ctx, id, mechanism.Spec{}); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := m.Start(ctx, id); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			var once sync.Once
			var first time.Duration
			_, err := m.Execute(ctx, id, []string{"echo", "hi"}, mechanism.ExecOptions{OnOutput: func(mechanism.Stream, []byte) {
				once.Do(func() { first = time.Since(t0) })
			}})
			if err != nil || first == 0 {
				b.Fatalf("%s: %v (first output %v)", m.Name(), err, first)
			}
			total[i] += first
			steps[i][0] += t1.Sub(t0)
			steps[i][1] += t2.Sub(t1)
			steps[i][2] += first - t2.Sub(t0)
			if err := m.Destroy(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		n++
	}
	for i := range total {
		total[i] /= time.Duration(n)
		for j := range steps[i] {
			steps[i][j] /= time.Duration(n)
		}
	}
	report(b, ms, total, "start")
	for i, m := range ms {
		for j, step := range []string{"provision", "startcall", "exec"} {
			b.ReportMetric(float64(steps[i][j].Microseconds())/1000, "ms-"+step+"/"+m.Name())
		}
	}
}

// BenchmarkExecuteTrue: Execute of /bin/true in a running sandbox, per
// mechanism, in the same loop; the ratios are against the jail.
func BenchmarkExecuteTrue(b *testing.B) {
	ms := benchMechs(b)
	ctx := context.Background()
	for _, m := range ms {
		if err := m.Provision(ctx, "ex", mechanism.Spec{}); err != nil {
			b.Fatal(err)
		}
		defer m.Destroy(context.Background(), "ex")
		if err := m.Start(ctx, "ex"); err != nil {
			b.Fatal(err)
		}
	}
	total := make([]time.Duration, len(ms))
	n := 0
	for b.Loop() {
		for i, m := range ms {
			t0 := time.Now()
			if c, err := m.Execute(ctx, "ex", []string{"/bin/true"}, mechanism.ExecOptions{}); err != nil || c.ExitStatus != 0 {
				b.Fatalf("%s: %+v %v", m.Name(), c, err)
			}
			total[i] += time.Since(t0)
		}
		n++
	}
	for i := range total {
		total[i] /= time.Duration(n)
	}
	report(b, ms, total, "exec")
}
