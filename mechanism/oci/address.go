package oci

import (
	"context"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
)

// Published ports of a runc container (as root) are mechanism/egress's,
// as the jail's: while the container runs, the process that started it
// listens on a free port of the host's 127.0.0.1 for each Spec.Publish
// port and relays each connection to that port on the container's own
// loopback (entering its network namespace to dial), whatever its
// network (egress or none). published.json in the sandbox's directory
// says where, for the container's init of that start; Address reads it.
// gVisor's runsc publishes where its container's network is egress: its
// sentry then opens the workload's sockets as host-kernel sockets in the
// container's namespace (--network=host there, network.go), which the
// relay enters as runc's; with network none the workload's loopback is
// gVisor's own stack, which nothing on the host can enter, so a
// Spec.Publish is refused there.

var _ mechanism.Addresser = (*Mechanism)(nil)

func (m *Mechanism) publishedPath(id string) string {
	return filepath.Join(m.dir(id), "published.json")
}

// refusePublish refuses a Spec.Publish this mechanism cannot keep.
func (m *Mechanism) refusePublish(spec mechanism.Spec) error {
	if len(spec.Publish) == 0 {
		return nil
	}
	detail := ""
	switch {
	case m.rt.gvisor && m.networkOf(spec) != mechanism.NetworkEgress:
		detail = "oci/runsc publishes a port only with an egress network: with network none the workload's loopback is gVisor's own stack, which the host cannot enter"
	case os.Geteuid() != 0:
		detail = "publishing a port needs root (it enters the container's network namespace)"
	default:
		return nil
	}
	return &mechanism.UnavailableError{Mechanism: m.Name(), Missing: []mechanism.Report{{Name: mechanism.NetworkRestriction, Detail: detail}}}
}

// startPublish publishes spec.Publish of the running container whose
// init is pid, unless this process publishes them already or another
// process does (its ports answer).
func (m *Mechanism) startPublish(id string, spec mechanism.Spec, pid int) error {
	if len(spec.Publish) == 0 {
		return nil
	}
	if err := m.refusePublish(spec); err != nil {
		return err
	}
	if m.nets.HasPorts(id) {
		return nil
	}
	if a := egress.PublishedAddr(m.publishedPath(id), pid, spec.Publish[0]); a != "" && egress.Listening(a) {
		return nil
	}
	ps, err := egress.PublishPorts(pid, spec.Publish, m.publishedPath(id))
	if err != nil {
		return err
	}
	m.nets.SetPorts(id, ps)
	return nil
}

// startNet gives the started container whose init is pid its egress and
// its published ports.
func (m *Mechanism) startNet(id string, spec mechanism.Spec, pid int) error {
	if err := m.startNetwork(id, spec, pid); err != nil {
		return err
	}
	if err := m.startPublish(id, spec, pid); err != nil {
		m.stopNetwork(id)
		return err
	}
	return nil
}

// Address implements mechanism.Addresser: the host's loopback address
// ("127.0.0.1:PORT") where port of the running container id is
// published, or "" when it is not running or does not publish port.
// It reads files only (no runtime call): the container runs when the
// init of published.json is alive and in the container's cgroup.
func (m *Mechanism) Address(ctx context.Context, id string, port int) (string, error) {
	sb, err := m.open(id)
	if err != nil {
		return "", err
	}
	pid, err := m.initPid(id)
	if err != nil || m.cgroupOf(sb) == nil {
		return "", nil // not running
	}
	return egress.PublishedAddr(m.publishedPath(id), pid, port), nil
}
