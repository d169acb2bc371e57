package main

import (
	"fmt"

	"github.com/managoat/managoat/provider/local"
)

// homeQuota is the default home quota of the local provider the CLI
// opens, for doctor.
type homeQuota struct {
	bytes int64
	how   string
}

func (q homeQuota) String() string {
	if q.bytes <= 0 {
		return "none, the home is unbounded: " + q.how
	}
	return fmt.Sprintf("%d MiB (%s)", q.bytes>>20, q.how)
}

// defaultHomeQuota asks the local provider this invocation would use
// (its mechanism and state directory) what a sandbox made without --disk
// gets, and why.
func defaultHomeQuota() homeQuota {
	p, err := local.New(local.Config{MechanismName: current.mechanism})
	if err != nil {
		return homeQuota{how: "the local provider does not open: " + err.Error()}
	}
	n, how := p.DefaultDiskQuota()
	return homeQuota{n, how}
}
