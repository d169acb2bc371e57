package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
)

// Egress of a container (as root) is mechanism/egress's, as the jail's:
// once the runtime made the container's network namespace (only lo), the
// proxy of the process that started it sets the namespace up and serves
// its connections and queries; it ends with the container's init or at
// Stop. gVisor's runsc gets the same: a container whose network is
// egress is created and started with --network=host, so its sandbox
// (the sentry) lives in that fresh namespace (the bundle names none to
// join) and opens its sockets as the host kernel's sockets there, which
// the namespace's packet filter redirects to the proxy like any other
// (runsc's own stack, --network=sandbox, cannot be used: this runsc
// refuses it on kernels that show net.core.rmem_default in every
// namespace, "cannot run with network enabled in root network
// namespace", and would take the namespace's interfaces for itself).
// Tried by hand, that check is passed by running `runsc start` in a
// mount namespace with a tmpfs over /proc/sys/net, and gVisor's stack
// then reaches, over a veth, a namespace next to it where the proxy
// could sit; what that way still needs is a resolver address outside
// gVisor's own loopback in the container's resolv.conf (127.0.0.53 never
// leaves gVisor), which the shared root's /etc does not give.
// Inside, the workload cannot change that namespace: it has no
// capabilities, and gVisor's host network has no netfilter netlink and
// no raw sockets (TestRunscEgressCannotTouchItsNamespace; by hand, a
// container given CAP_NET_ADMIN, CAP_NET_RAW and CAP_SYS_ADMIN could not
// take lo down, add a route or an address either). The price is the
// host kernel's TCP/IP behind the sentry's socket calls instead of
// gVisor's own stack, and one defect of this runsc release's host
// network: a blocking read(2) or write(2) on a TCP socket that would
// block returns EAGAIN instead of waiting (its Read and Write pass the
// host descriptor's, which is non-blocking, through; seen with cat and
// dd on bash's /dev/tcp). recv/send and I/O that polls first work:
// curl, Python's socket and ssl, and a Go program (its runtime's
// non-blocking sockets and epoll) writing 64 MiB and reading the answer
// were tried (the breach conformance and BenchmarkEgressThroughput use
// the first two). A container whose
// network is none keeps --network=none (gVisor's loopback only).

// egressOK reports whether this mechanism gives containers egress.
func (m *Mechanism) egressOK() bool { return os.Geteuid() == 0 }

// withNet is the runtime's args for a subcommand (create, start) of the
// container of spec: for runsc and an egress network, --network=host
// first, which overrides the global --network=none (runtime.go; the
// last flag wins).
func (m *Mechanism) withNet(spec mechanism.Spec, args ...string) []string {
	if m.rt.gvisor && m.networkOf(spec) == mechanism.NetworkEgress {
		return append([]string{"--network=host"}, args...)
	}
	return args
}

// networkOf is the network a container of spec gets.
func (m *Mechanism) networkOf(spec mechanism.Spec) string {
	if spec.Network == "" {
		if m.egressOK() {
			return mechanism.NetworkEgress
		}
		return mechanism.NetworkNone
	}
	return spec.Network
}

func (m *Mechanism) policyPath(id string) string { return filepath.Join(m.dir(id), "egress.json") }

func (m *Mechanism) egressSocket(id string) string {
	run, _ := mechanism.DefaultRunDir()
	sum := sha256.Sum256([]byte(m.dir(id)))
	return filepath.Join(run, "oci-"+hex.EncodeToString(sum[:8])+".egress")
}

// validateNetwork refuses a Spec whose allow list does not parse.
func validateNetwork(spec mechanism.Spec) error {
	if len(spec.Egress) > 0 {
		if _, err := egress.ParsePolicy(spec.Egress); err != nil {
			return err
		}
	}
	return nil
}

// policyOf: the list UpdateEgress recorded, else Spec.Egress, else none.
func (m *Mechanism) policyOf(id string, spec mechanism.Spec) (*egress.Policy, error) {
	return egress.LoadPolicy(m.policyPath(id), spec.Egress)
}

// startNetwork gives the running container whose init is pid its egress
// (when its network is egress and nobody serves it already).
func (m *Mechanism) startNetwork(id string, spec mechanism.Spec, pid int) error {
	if m.networkOf(spec) != mechanism.NetworkEgress {
		return nil
	}
	if m.nets.Proxy(id) != nil || egress.Serving(m.egressSocket(id)) {
		return nil
	}
	pol, err := m.policyOf(id, spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(m.egressSocket(id)), 0o700); err != nil {
		return err
	}
	p, err := egress.Attach(pid, pol, m.cfg.Egress)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	if err := p.ServeControl(m.egressSocket(id)); err != nil {
		p.Close()
		return fmt.Errorf("egress control socket: %w", err)
	}
	p.CloseWhen(egress.WhenExits(pid))
	m.nets.SetProxy(id, p)
	return nil
}

// stopNetwork ends the proxy this process serves for id, if any.
func (m *Mechanism) stopNetwork(id string) { m.nets.Stop(id) }

// UpdateEgress implements mechanism.EgressUpdater: for a container whose
// network is egress, allow is put in force in its proxy (new connections
// at once; the open ones it denies are cut before it returns) and kept
// for the next start; an empty list denies all. A container without
// network has nothing to open: the empty list is what is in force,
// anything else is refused naming egress_allowlist.
func (m *Mechanism) UpdateEgress(ctx context.Context, id string, allow []string) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	if _, err := egress.ParsePolicy(allow); err != nil {
		return err
	}
	sb, err := m.open(id) // a spec it cannot read is that error, not "not found"
	if err != nil {
		return err
	}
	if m.networkOf(sb.Spec) != mechanism.NetworkEgress {
		if len(allow) == 0 {
			return nil
		}
		return &mechanism.UnavailableError{Mechanism: m.Name(), Missing: []mechanism.Report{{
			Name: mechanism.EgressAllowlist, Detail: "the container was made with network none (only lo): it can deny all but allow nothing"}}}
	}
	if err := egress.SavePolicy(m.policyPath(id), allow); err != nil {
		return err
	}
	if p := m.nets.Proxy(id); p != nil {
		pol, _ := egress.ParsePolicy(allow)
		_, err := p.SetPolicy(pol)
		return err
	}
	if st, err := m.Status(ctx, id); err != nil {
		return err
	} else if st != mechanism.StatusRunning {
		return nil // in force from its next start
	}
	return egress.Apply(ctx, m.egressSocket(id), allow)
}
