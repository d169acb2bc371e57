// Package lifecycle keeps the platform's records and its providers in
// step: it parks idle sandboxes, reaps what is gone, destroys orphans of
// crashed creates, and reconciles the intents of bounded operations whose
// outcome was uncertain.
//
//	m := lifecycle.New(lifecycle.Config{Store: st, API: srv})
//	go m.Run(ctx) // a pass every Interval (1 min)
//
// Idle parking: a sandbox with no call on it, no open stream (attached
// client or streaming spawn), no running session and no session active
// within Idle (15 min) is parked: suspended where its provider advertises
// suspend, else destroyed (never a pretended park; the record says which).
// The next use wakes it on the same provider (api.Server.Wake). A call
// starting during a park, on any replica, either stops it or waits for it
// and wakes the sandbox (api.Server.Park says how). A park that died
// midway (its record "parking" for api.ParkingStale) is settled from the
// provider's state: parked when suspended or destroyed, else running.
//
// Reconciliation, per enabled provider, each pass: ListAllNames; a
// listing that fails or is truncated (ErrTruncated) reconciles nothing for
// that provider. Each record is asked for with Get: one missing from the
// listing is deleted only when Get says ErrNotFound, and any other error
// changes nothing, so a provider answering 503 for minutes loses no parked
// sandbox; one present gets the provider's status (running/suspended).
// A platform-made name (api.NamePrefix) with no record, still unrecorded
// Grace (10 min) after this process first saw it, is the orphan of a
// crashed create and is destroyed. A runner's sandboxes are reconciled per
// account, over that account's online runners.
//
// Intents: an uncertain (or long-pending) create_new, destroy_once or
// terminate_session is settled by looking, never by writing again: Get
// says whether the sandbox exists, ListSessions whether the session does.
// A create the provider did make gets its record finished by the API's own
// rule (api.Server.Settle: instance id, url, state), so it reads as one
// created normally.
// A create_checkpoint_once cannot be looked at through the contract, so it
// is resolved as unverifiable rather than repeated. Settled intents are
// removed after IntentRetention (24 h); open ones never.
//
// Several replicas: with Config.Lease (store/postgres's Holder.Held), a pass
// runs only on the replica holding the lease, so exactly one replica parks
// and reaps at a time; when it dies its lease is freed with its database
// connection and another replica, asking every LeaseRetry (15 s), takes
// over and passes at once. Every replica's Run marks, every Interval, the
// activity of the calls and streams it serves, so the one that parks does
// not take a sandbox busy on another replica for idle.
package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// Config configures a Manager.
type Config struct {
	Store store.Store
	API   *api.Server
	// Idle is how long a sandbox may go unused before it is parked
	// (default 15 min; negative: never).
	Idle time.Duration
	// Interval is the time between passes (default 1 min).
	Interval time.Duration
	// Grace is how long an unrecorded platform-made sandbox may live
	// before it counts as an orphan, and a pending intent before it counts
	// as uncertain (default 10 min).
	Grace time.Duration
	// Parallel bounds concurrent provider calls of a pass (default 8).
	Parallel int
	// IntentRetention is how long a settled intent is kept (default 24 h;
	// negative: for ever). Every bounded write adds one, so a client
	// sending them grew the intents table without end.
	IntentRetention time.Duration
	// Lease, when set, is asked before every pass; a pass runs only when
	// it reports held. With several replicas on one database it is
	// store/postgres's lease, so one replica works at a time. Unset, every
	// pass runs (one replica, the embedded store).
	Lease func(ctx context.Context) (held bool)
	// LeaseRetry is how often a replica asks for the Lease (default
	// 15 s, at most Interval): the takeover delay after the holder's death.
	LeaseRetry time.Duration
	Now        func() time.Time
	Logger     *slog.Logger
}

// Manager runs the passes.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	firstSeen map[string]time.Time // provider\x00name of unrecorded platform-made sandboxes
	pruned    time.Time            // when settled intents were last pruned (at most hourly)
}

// New returns a Manager.
func New(cfg Config) *Manager {
	if cfg.Idle == 0 {
		cfg.Idle = 15 * time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Minute
	}
	if cfg.LeaseRetry <= 0 {
		cfg.LeaseRetry = 15 * time.Second
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.IntentRetention == 0 {
		cfg.IntentRetention = 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, log: cfg.Logger, firstSeen: map[string]time.Time{}}
}

// Run makes a pass every Interval until ctx ends.
//
// With a Lease, Run steps every LeaseRetry (at most Interval): a replica
// without the lease asks for it at each step and passes at once when it
// gets it (so one takes over within a step of the holder's death being
// known to the database), the holder passes every Interval; and every
// Interval each replica first marks the activity of the sandboxes it has
// a call or stream open on (the replica holding the lease sees only its
// own).
func (m *Manager) Run(ctx context.Context) error {
	step := m.cfg.Interval
	if m.cfg.Lease != nil && m.cfg.LeaseRetry < step {
		step = m.cfg.LeaseRetry
	}
	t := time.NewTicker(step)
	defer t.Stop()
	var passed, touched time.Time // zero: never
	due := func(last time.Time) bool { return last.IsZero() || time.Since(last) >= m.cfg.Interval-step/2 }
	for {
		switch {
		case m.cfg.Lease == nil:
			m.Pass(ctx)
		default:
			if due(touched) {
				m.touchActive(ctx)
				touched = time.Now()
			}
			if m.cfg.Lease(ctx) {
				if due(passed) {
					m.Pass(ctx)
					passed = time.Now()
				}
			} else {
				passed = time.Time{} // on taking the lease (back), pass at once
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// touchActive moves the LastActivity of every record with a call or
// stream open in this process to now, so that the replica parking (this
// one or another) sees it in use. A call's own activity is recorded at its
// start and its end only; an hour-long exec or attach on one replica is
// otherwise idle to the others.
func (m *Manager) touchActive(ctx context.Context) {
	recs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		return
	}
	now := m.cfg.Now().UTC()
	for _, rec := range recs {
		if m.cfg.API.Active(rec.AccountID, rec.Name) {
			if err := m.cfg.Store.TouchSandbox(ctx, rec.AccountID, rec.Name, now); err != nil && !errors.Is(err, store.ErrNotFound) {
				m.log.Warn("lifecycle: marking activity", "account", rec.AccountID, "sandbox", rec.Name, "err", err)
			}
		}
	}
}

// Report counts what a pass did.
type Report struct {
	Parked, Gone, Updated, Orphans, Intents int
	Pruned                                  int64    // settled intents removed (past IntentRetention)
	Skipped                                 []string // providers whose listing failed or was truncated
}

// Pass parks idle sandboxes, reconciles every enabled provider and
// settles open intents.
func (m *Manager) Pass(ctx context.Context) Report {
	var r Report
	recs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		m.log.Warn("lifecycle: listing records", "err", err)
		return r
	}
	r.Parked = m.parkIdle(ctx, recs)
	if r.Parked > 0 {
		if recs, err = m.cfg.Store.ListSandboxes(ctx, ""); err != nil {
			return r
		}
	}
	m.reconcile(ctx, recs, &r)
	r.Intents = m.settle(ctx)
	r.Pruned = m.prune(ctx)
	return r
}

// prune removes the settled intents older than IntentRetention, at most
// once an hour (a delete over the whole table).
func (m *Manager) prune(ctx context.Context) int64 {
	now := m.cfg.Now()
	m.mu.Lock()
	due := m.cfg.IntentRetention > 0 && (m.pruned.IsZero() || now.Sub(m.pruned) >= time.Hour)
	if due {
		m.pruned = now
	}
	m.mu.Unlock()
	if !due {
		return 0
	}
	n, err := m.cfg.Store.PruneIntents(ctx, now.Add(-m.cfg.IntentRetention))
	if err != nil {
		m.log.Warn("lifecycle: pruning settled intents", "err", err)
	}
	return n
}

// each runs f over items with at most Parallel at once.
func each[T any](n int, items []T, f func(T)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(it)
		})
	}
	wg.Wait()
}

func (m *Manager) parkIdle(ctx context.Context, recs []store.Sandbox) int {
	if m.cfg.Idle < 0 {
		return 0
	}
	cutoff := m.cfg.Now().Add(-m.cfg.Idle)
	var idle []store.Sandbox
	for _, rec := range recs {
		if (rec.State == store.StateRunning || rec.State == store.StateUnknown) && rec.LastActivity.Before(cutoff) &&
			!m.cfg.API.Active(rec.AccountID, rec.Name) {
			idle = append(idle, rec)
		}
	}
	var mu sync.Mutex
	n := 0
	each(m.cfg.Parallel, idle, func(rec store.Sandbox) {
		if m.sessionActive(ctx, rec, cutoff) {
			return
		}
		if _, err := m.cfg.API.Park(ctx, rec, cutoff); err != nil {
			if !errors.Is(err, store.ErrConflict) {
				m.log.Warn("lifecycle: park", "account", rec.AccountID, "sandbox", rec.Name, "err", err)
			}
			return
		}
		mu.Lock()
		n++
		mu.Unlock()
	})
	return n
}

// sessionActive reports whether a session of the sandbox is running, or
// was active after cutoff (an unanswered question counts as active: never
// park on a doubt). A running session is use however quiet it is (a
// detached `sleep 3600` writes nothing); an ended one counts by its last
// activity; one whose state the provider does not say counts by its last
// activity, and as active when that is unknown too.
func (m *Manager) sessionActive(ctx context.Context, rec store.Sandbox, cutoff time.Time) bool {
	p, err := m.cfg.API.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		return true
	}
	ss, err := p.ListSessions(ctx, handle(rec))
	if errors.Is(err, sandbox.ErrNotSupported) {
		return false
	}
	if err != nil {
		return true
	}
	for _, s := range ss {
		switch s.State {
		case sandbox.SessionRunning:
			return true
		case sandbox.SessionExited, sandbox.SessionLost:
			if s.LastActivityAt.After(cutoff) {
				return true
			}
		default:
			if s.LastActivityAt.IsZero() || s.LastActivityAt.After(cutoff) {
				return true
			}
		}
	}
	return false
}

func handle(rec store.Sandbox) *sandbox.Handle {
	h := sandbox.BuildHandle(rec.Provider, rec.ProviderName)
	h.InstanceID = rec.InstanceID
	return h
}

// scope is one listing: a provider, or the runner provider of one account.
type scope struct {
	provider, account string
}

func (m *Manager) reconcile(ctx context.Context, recs []store.Sandbox, r *Report) {
	pol := m.cfg.API.Policy()
	byScope := map[scope][]store.Sandbox{}
	for _, rec := range recs {
		sc := scope{provider: rec.Provider}
		if rec.Provider == policy.Runner {
			sc.account = rec.AccountID
		}
		byScope[sc] = append(byScope[sc], rec)
	}
	for _, name := range pol.EnabledNames() {
		if name != policy.Runner {
			if _, ok := byScope[scope{provider: name}]; !ok {
				byScope[scope{provider: name}] = nil // orphans only
			}
		}
	}
	seen := map[string]bool{}   // provider\x00name of the unrecorded platform-made names listed now
	listed := map[string]bool{} // the providers whose listing this pass had whole
	for sc, list := range byScope {
		if !pol.Enabled(sc.provider) {
			continue
		}
		p, err := m.cfg.API.ProviderFor(sc.account, sc.provider)
		if err != nil {
			continue
		}
		names, err := p.ListAllNames(ctx)
		if err != nil {
			// Truncated or failed: reconcile nothing of this scope.
			r.Skipped = append(r.Skipped, sc.provider)
			m.log.Warn("lifecycle: listing", "provider", sc.provider, "err", err)
			continue
		}
		slices.Sort(names)
		recorded := map[string]bool{}
		for _, rec := range list {
			recorded[rec.ProviderName] = true
		}
		var mu sync.Mutex
		each(m.cfg.Parallel, list, func(rec store.Sandbox) {
			gone, updated := m.check(ctx, p, rec, names)
			mu.Lock()
			if gone {
				r.Gone++
			}
			if updated {
				r.Updated++
			}
			mu.Unlock()
		})
		if sc.provider == policy.Runner {
			continue // runner names carry their runner, not the platform's prefix
		}
		var orphans []string
		for _, n := range names {
			if len(n) > len(api.NamePrefix) && n[:len(api.NamePrefix)] == api.NamePrefix && !recorded[n] {
				orphans = append(orphans, n)
			}
		}
		listed[sc.provider] = true
		r.Orphans += m.reapOrphans(ctx, p, sc.provider, orphans, seen)
	}
	// Forget the names a whole listing no longer shows unrecorded (recorded
	// since, or gone); a provider whose listing failed or was truncated
	// keeps its names' first sight, so one bad answer does not restart
	// their grace.
	m.mu.Lock()
	for k := range m.firstSeen {
		if prov, _, _ := strings.Cut(k, "\x00"); listed[prov] && !seen[k] {
			delete(m.firstSeen, k)
		}
	}
	m.mu.Unlock()
}

// check brings one record in step with its provider. It reports whether
// the record was deleted (the provider said not found) or updated.
func (m *Manager) check(ctx context.Context, p sandbox.Provider, rec store.Sandbox, listed []string) (gone, updated bool) {
	if rec.State == store.StateParked && rec.ParkedBy == store.ParkDestroy {
		return false, false // destroyed on purpose; the record is the truth
	}
	if rec.State == store.StateCreating && m.cfg.Now().Sub(rec.CreatedAt) < m.cfg.Grace {
		return false, false // a create may be under way
	}
	parking := rec.State == store.StateParking
	if parking && m.cfg.Now().Sub(rec.ParkedAt) < api.ParkingStale {
		return false, false // a park is under way
	}
	_, present := slices.BinarySearch(listed, rec.ProviderName)
	info, err := p.Get(ctx, handle(rec))
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		if present {
			return false, false // listed yet not found: ask again next pass
		}
		if parking && rec.ParkedBy == store.ParkDestroy {
			// A park by destroy that died after the destroy: parked.
			rec.State = store.StateParked
			_, err := m.cfg.Store.UpdateSandbox(ctx, rec)
			return false, err == nil
		}
		// Only the record read, at its Version: one changed since (a park,
		// a wake, a new sandbox of the name, even in the instant before
		// the delete) is left for the next pass.
		if err := m.cfg.Store.DeleteSandboxIf(ctx, rec); err != nil {
			return false, false
		}
		m.log.Info("lifecycle: gone from its provider", "account", rec.AccountID, "sandbox", rec.Name, "provider", rec.Provider)
		return true, false
	case err != nil:
		return false, false // transient: change nothing
	}
	if rec.State == store.StateCreating {
		// A create cut short that the provider did make: the record gets
		// what the create would have given it (instance id, url).
		_, err := m.cfg.API.Settle(ctx, rec, info)
		return false, err == nil
	}
	state := rec.State
	switch info.Status {
	case sandbox.StatusRunning:
		state = store.StateRunning
	case sandbox.StatusSuspended:
		switch rec.State {
		case store.StateParking:
			state = store.StateParked // a park that died after its suspend
		case store.StateParked:
		default:
			state = store.StateSuspended
		}
	}
	if state == store.StateParking {
		state = store.StateUnknown // a dead park, the provider's status unrecognised
	}
	if state == rec.State {
		return false, false
	}
	rec.State = state
	if state != store.StateParked {
		rec.ParkedAt, rec.ParkedBy = time.Time{}, ""
	}
	_, err = m.cfg.Store.UpdateSandbox(ctx, rec)
	return false, err == nil
}

func (m *Manager) reapOrphans(ctx context.Context, p sandbox.Provider, provider string, names []string, seen map[string]bool) int {
	now := m.cfg.Now()
	var due []string
	m.mu.Lock()
	for _, n := range names {
		k := provider + "\x00" + n
		seen[k] = true
		first, ok := m.firstSeen[k]
		if !ok {
			m.firstSeen[k] = now
			continue
		}
		if now.Sub(first) >= m.cfg.Grace {
			due = append(due, n)
		}
	}
	m.mu.Unlock()
	n := 0
	for _, name := range due {
		// Re-check: a create may have recorded it since the listing.
		if m.recordedElsewhere(ctx, provider, name) {
			continue
		}
		if err := p.Destroy(ctx, sandbox.BuildHandle(provider, name)); err != nil {
			m.log.Warn("lifecycle: orphan", "provider", provider, "name", name, "err", err)
			continue
		}
		m.log.Info("lifecycle: destroyed an orphan of a crashed create", "provider", provider, "name", name)
		m.mu.Lock()
		delete(m.firstSeen, provider+"\x00"+name)
		m.mu.Unlock()
		n++
	}
	return n
}

func (m *Manager) recordedElsewhere(ctx context.Context, provider, name string) bool {
	recs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		return true // in doubt, keep it
	}
	for _, r := range recs {
		if r.Provider == provider && r.ProviderName == name {
			return true
		}
	}
	return false
}

// settle reconciles open intents by looking, never by writing again.
func (m *Manager) settle(ctx context.Context) int {
	ins, err := m.cfg.Store.OpenIntents(ctx)
	if err != nil {
		return 0
	}
	n := 0
	for _, in := range ins {
		if in.State == store.IntentPending && m.cfg.Now().Sub(in.UpdatedAt) < m.cfg.Grace {
			continue // its call may still be under way
		}
		p, err := m.cfg.API.ProviderFor(in.AccountID, in.Provider)
		if err != nil {
			continue
		}
		h := sandbox.BuildHandle(in.Provider, in.ProviderName)
		h.InstanceID = in.InstanceID
		detail := ""
		switch in.Op {
		case store.OpCreateNew, store.OpDestroyOnce:
			info, err := p.Get(ctx, h)
			switch {
			case errors.Is(err, sandbox.ErrNotFound):
				detail = "absent"
				// A create_new's record goes only while it is still
				// creating: one finished since (the intent's outcome
				// unrecorded) may be parked by destroy, absent on purpose.
				// DeleteSandboxIf at the Version read: the state just
				// checked is the one deleted.
				if rec, gerr := m.cfg.Store.GetSandbox(ctx, in.AccountID, in.Name); gerr == nil && rec.ProviderName == in.ProviderName &&
					(in.Op == store.OpDestroyOnce || rec.State == store.StateCreating) {
					_ = m.cfg.Store.DeleteSandboxIf(ctx, rec)
				}
			case err != nil:
				continue // still uncertain
			default:
				detail = "present"
				if rec, gerr := m.cfg.Store.GetSandbox(ctx, in.AccountID, in.Name); gerr == nil && rec.ProviderName == in.ProviderName && rec.State == store.StateCreating {
					if _, err := m.cfg.API.Settle(ctx, rec, info); err != nil {
						continue // not finished: settle it next pass
					}
				}
			}
		case store.OpTerminateSession:
			ss, err := p.ListSessions(ctx, h)
			switch {
			case errors.Is(err, sandbox.ErrNotFound):
				detail = "sandbox absent"
			case err != nil:
				continue
			default:
				detail = "session absent"
				if slices.ContainsFunc(ss, func(s sandbox.Session) bool { return s.ID == in.Arg }) {
					detail = "session present (not terminated; not retried)"
				}
			}
		default:
			detail = "unverifiable through the contract; not retried"
		}
		if err := m.cfg.Store.SetIntent(ctx, in.ID, store.IntentResolved, detail); err == nil {
			n++
		}
	}
	return n
}
