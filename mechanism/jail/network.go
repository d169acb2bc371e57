package jail

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
)

// A sandbox's egress proxy (Jail.nets) lives in the process that started
// the sandbox (a provider/local sandbox's supervisor) and ends with the
// sandbox's init or with that process: its sockets live in the sandbox's
// network namespace, so when it is gone every connection the sandbox
// opens is reset and every query goes unanswered (it fails closed), until
// a Start adopts the sandbox again.

var _ mechanism.Addresser = (*Jail)(nil)

func (j *Jail) publishedPath(id string) string { return filepath.Join(j.dir(id), "published.json") }

// startPublish publishes the sandbox's Spec.Publish ports on the host's
// loopback (in this process, beside its egress) and records where.
// Without root mechanism/egress's socket helper, which nsenter starts in
// the sandbox's namespaces, makes the sockets that reach the sandbox's
// loopback; where nsenter is missing publishing is refused naming
// network_restriction.
func (j *Jail) startPublish(st *state, pid int) error {
	if len(st.Spec.Publish) == 0 {
		return nil
	}
	if j.rootless && !rootlessEgress() {
		_, why := egress.RootlessSupported()
		return &mechanism.UnavailableError{Mechanism: "jail", Missing: []mechanism.Report{{
			Name: mechanism.NetworkRestriction, Detail: "publishing a port without root: " + why}}}
	}
	pubs, err := egress.PublishPorts(pid, st.Spec.Publish, j.publishedPath(st.ID))
	if err != nil {
		return err
	}
	j.nets.SetPorts(st.ID, pubs)
	return nil
}

// Address implements mechanism.Addresser: the host's loopback address
// ("127.0.0.1:PORT") where port of the running sandbox id is published,
// or "" when it is not running or does not publish port.
func (j *Jail) Address(ctx context.Context, id string, port int) (string, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return "", err
	}
	st, err := readState(j.dir(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return "", err
	}
	if !alive(st) {
		return "", nil
	}
	return egress.PublishedAddr(j.publishedPath(id), st.InitPid, port), nil
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

// networkOf is the network the sandbox of spec gets from this jail.
func (j *Jail) networkOf(spec mechanism.Spec) string {
	if spec.Network == "" {
		if j.rootless && !rootlessEgress() {
			return mechanism.NetworkNone
		}
		return mechanism.NetworkEgress
	}
	return spec.Network
}

// policyPath holds the allow list last put in force by UpdateEgress.
func (j *Jail) policyPath(id string) string { return filepath.Join(j.dir(id), "egress.json") }

// egressSocket is the control socket of the proxy of id (in RunDir: its
// path must stay short).
func (j *Jail) egressSocket(id string) string {
	sum := sha256.Sum256([]byte(j.dir(id)))
	return filepath.Join(j.cfg.RunDir, hex.EncodeToString(sum[:8])+".egress")
}

// policyOf is the policy a starting sandbox is put under: the one
// UpdateEgress recorded, else Spec.Egress, else none (every public
// destination).
func (j *Jail) policyOf(st *state) (*egress.Policy, error) {
	return egress.LoadPolicy(j.policyPath(st.ID), st.Spec.Egress)
}

// startNetwork gives a started sandbox (its init is pid) its egress, when
// its network is egress; the proxy ends when done is closed (the init was
// reaped) or at cleanup.
func (j *Jail) startNetwork(st *state, pid int, done <-chan struct{}) error {
	if j.networkOf(st.Spec) != mechanism.NetworkEgress {
		return nil
	}
	if j.rootless && !rootlessEgress() {
		_, why := egress.RootlessSupported()
		return &mechanism.UnavailableError{Mechanism: "jail", Missing: []mechanism.Report{{
			Name: mechanism.EgressAllowlist, Detail: why}}}
	}
	pol, err := j.policyOf(st)
	if err != nil {
		return err
	}
	p, err := egress.Attach(pid, pol, j.cfg.Egress)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	if err := p.ServeControl(j.egressSocket(st.ID)); err != nil {
		p.Close()
		return fmt.Errorf("egress control socket: %w", err)
	}
	if done != nil {
		p.CloseWhen(done)
	}
	j.nets.SetProxy(st.ID, p)
	return nil
}

// netStart is a startNetwork under way (begun as soon as the init
// exists, so that it overlaps the init's own start).
type netStart struct {
	j    *Jail
	id   string
	ch   chan error
	once sync.Once
	err  error
}

func (j *Jail) beginNetwork(st *state, pid int, done <-chan struct{}) *netStart {
	n := &netStart{j: j, id: st.ID, ch: make(chan error, 1)}
	stc := *st
	go func() {
		err := j.startNetwork(&stc, pid, done)
		if err == nil {
			err = j.startPublish(&stc, pid)
		}
		n.ch <- err
	}()
	return n
}

// wait returns startNetwork's result.
func (n *netStart) wait() error {
	n.once.Do(func() { n.err = <-n.ch })
	return n.err
}

// abort waits for the start and ends the proxy it made.
func (n *netStart) abort() {
	_ = n.wait()
	n.j.stopNetwork(n.id)
}

// adoptNetwork gives a running sandbox whose egress nobody serves (the
// process that started it died: its connections are refused since) a
// proxy in this process again.
func (j *Jail) adoptNetwork(st *state) error {
	if !j.nets.HasPorts(st.ID) && len(st.Spec.Publish) > 0 {
		if addr, _ := j.Address(context.Background(), st.ID, st.Spec.Publish[0]); addr == "" || !egress.Listening(addr) {
			if err := j.startPublish(st, st.InitPid); err != nil {
				return err
			}
		}
	}
	if j.networkOf(st.Spec) != mechanism.NetworkEgress {
		return nil
	}
	if j.nets.Proxy(st.ID) != nil || egress.Serving(j.egressSocket(st.ID)) {
		return nil
	}
	return j.startNetwork(st, st.InitPid, egress.WhenExits(st.InitPid))
}

// stopNetwork ends the proxy this process serves for id, if any.
func (j *Jail) stopNetwork(id string) { j.nets.Stop(id) }

// UpdateEgress implements mechanism.EgressUpdater. For a sandbox whose
// network is egress it puts allow in force in its proxy (whichever
// process serves it): new connections are checked against it at once
// and the open connections it does not allow are cut before it returns;
// the list is kept for the sandbox's next start. An empty list denies
// all. A sandbox with no network (none) has nothing to open: the empty
// list is what is in force, anything else is refused naming
// egress_allowlist.
func (j *Jail) UpdateEgress(ctx context.Context, id string, allow []string) error {
	if _, err := egress.ParsePolicy(allow); err != nil {
		return err
	}
	if s, err := j.Status(ctx, id); err != nil {
		return err
	} else if s != mechanism.StatusRunning {
		return fmt.Errorf("%w: %s is %s", mechanism.ErrNotRunning, id, s)
	}
	st, err := readState(j.dir(id))
	if err != nil {
		return err
	}
	if j.networkOf(st.Spec) != mechanism.NetworkEgress {
		if len(allow) == 0 {
			return nil
		}
		return &mechanism.UnavailableError{Mechanism: "jail", Missing: []mechanism.Report{{
			Name: mechanism.EgressAllowlist, Detail: "the sandbox was made with network none: it has only lo, so it can deny all but allow nothing",
		}}}
	}
	if err := egress.SavePolicy(j.policyPath(id), allow); err != nil {
		return err
	}
	if p := j.nets.Proxy(id); p != nil {
		pol, _ := egress.ParsePolicy(allow)
		_, err := p.SetPolicy(pol)
		return err
	}
	return egress.Apply(ctx, j.egressSocket(id), allow)
}

// rootlessEgress reports whether a rootless jail gives its sandboxes
// egress here (mechanism/egress's helper can enter their namespaces).
func rootlessEgress() bool {
	ok, _ := egress.RootlessSupported()
	return ok
}
