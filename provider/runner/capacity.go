package runner

import (
	"context"
	"encoding/json"
	"time"

	"github.com/managoat/managoat/provider/runner/wire"
)

type capReport struct {
	c  *wire.Capacity
	at time.Time
}

// capacityTimeout bounds one capacity call.
const capacityTimeout = 5 * time.Second

// refreshCapacity asks a runner that reports capacity (wire.CapCapacity)
// for its report and keeps it for Info; a failed call or a report out of
// range keeps the last one. It runs before each heartbeat, so the Host
// stores the new report with the runner's presence (natshost's bucket
// holds the Info as JSON: every replica places by the same report).
func (c *Conn) refreshCapacity() {
	if c.srv == nil || !c.info.HasCap(wire.CapCapacity) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), capacityTimeout)
	defer cancel()
	rep, err := c.Call(ctx, &wire.Request{Op: wire.OpCapacity}, nil)
	if err != nil || !rep.OK {
		return
	}
	var rc wire.Capacity
	if json.Unmarshal(rep.Result, &rc) != nil || rc.Validate() != nil {
		c.log.Debug("runner: capacity report dropped", "runner", c.info.ID)
		return
	}
	c.capacity.Store(&capReport{c: &rc, at: time.Now().UTC()})
}

// firstCapacity asks for the first report as soon as the socket reads,
// then has the Host store it with the presence (a heartbeat at once), so a
// runner is placed by its capacity from its first seconds, not from the
// first interval on.
func (c *Conn) firstCapacity() {
	if !c.info.HasCap(wire.CapCapacity) {
		return
	}
	go func() {
		c.refreshCapacity()
		select {
		case <-c.done:
		default:
			c.srv.cfg.Host.Heartbeat(c.info.ID)
		}
	}()
}
