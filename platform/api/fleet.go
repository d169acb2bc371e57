package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/store"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// A fleet of runners (issue 40): placement by capacity and labels, and
// an operator's cordon, drain and uncordon.
//
// A create on the runner provider is placed by provider/runner's policy
// (Place: eligible, fits, least loaded first) over the account's online
// runners (the Host's presence: every replica's view of every runner,
// with each runner's latest capacity report), the runner schedules and
// operator labels of the store, and what the records say each runner
// holds (the limits of its sandboxes' records). The record is then
// inserted with store.InsertSandboxWithin on the first candidate whose
// room (its reported capacity) still holds: the count and the insert are
// one transaction under the runner's lock in the database, so two
// replicas placing at once never put more on a runner than it reported;
// the loser of such a race goes to the next candidate. What a replica
// believes each runner holds is cached for fleetUsageTTL (plus its own
// placements since), only to order the candidates; the database decides.
//
// The policy in short (docs/operations.md, "A fleet of runners"):
// eligible (online, not cordoned or draining, the selector matching the
// daemon's labels with the operator's over them: those of enroll --label
// and POST labels win on a key both set), fits (each asked limit plus
// the records' asks within the reported capacity), least loaded first,
// the account's last runner first when prefer_last_runner asks and it fits;
// else 403 denied{no_runner_fits} (none eligible) or
// denied{resource_exhausted} (none with room), naming each runner's
// miss. A wake of a sandbox parked by destroy (not counted while parked)
// is refused the same way when its runner has no room left (wakeFits).
//
// A runner cordoned or draining (RunnerSchedule in the store, so it holds
// across replicas and restarts) takes no new sandbox; drain also parks
// its sandboxes (suspend where the runner can, as the idle park does), or
// with wait only waits for them to go, and each call answers the
// progress. A runner that is offline takes nothing, its sandboxes list
// with state runner_offline, and every call on them is 503
// unavailable{runner_offline} at once; they are as before when it is back.

// fleetUsageTTL is how long a replica's table of what each runner holds
// is used to order candidates before it is read from the store's
// counters again.
const fleetUsageTTL = 2 * time.Second

// maxPlaceTries bounds the candidates one create tries when races fill
// them under it.
const maxPlaceTries = 8

// fleetState is the Server's placement cache: per account, a table of
// what each of its runners holds.
type fleetState struct {
	mu    sync.Mutex
	accts map[string]*acctUsage
}

// acctUsage is one account's table. It is changed in place under mu:
// by this replica's placements (noteUsed), by the truth a refused insert
// learnt, and by a read of the store's counters every fleetUsageTTL (in
// the background, once at a time).
type acctUsage struct {
	mu         sync.Mutex
	at         time.Time                  // of the last read of the counters
	used       map[string]runnerprov.Used // by runner id
	refreshing bool
}

// placeKey carries a create's placement asks from the handler to Create.
type placeKey struct{}

// Placement is what a create asks of its runner.
type Placement struct {
	Selector   runnerprov.Selector
	PreferLast bool // the runner the account's latest sandbox went to, when it fits
}

// WithPlacement makes ctx carry p into Server.Create.
func WithPlacement(ctx context.Context, p Placement) context.Context {
	return context.WithValue(ctx, placeKey{}, p)
}

func placementOf(ctx context.Context) Placement {
	p, _ := ctx.Value(placeKey{}).(Placement)
	return p
}

// countUsed is what the records ask on each runner, by the store's rule
// (store.Usage): records of the runner provider, parked-by-destroy ones
// left out. It serves the runners' listing, which reads the records.
func countUsed(recs []store.Sandbox) map[string]runnerprov.Used {
	out := map[string]runnerprov.Used{}
	for _, r := range recs {
		if r.Provider != runnerprov.Name || r.State == store.StateParked && r.ParkedBy == store.ParkDestroy {
			continue
		}
		id, err := runnerprov.Parse(r.ProviderName)
		if err != nil {
			continue
		}
		u := out[id]
		u.MemoryBytes += r.Limits.MemoryBytes
		u.CPUMillis += int64(r.Limits.CPUMillis)
		u.DiskBytes += r.Limits.DiskBytes
		u.Sandboxes++
		out[id] = u
	}
	return out
}

// usageOf is the account's table: read from the store's counters of rs
// (its online runners) the first time, then as it is, with a read again
// in the background when it is fleetUsageTTL old.
func (s *Server) usageOf(ctx context.Context, accountID string, rs []runnerprov.Info) (*acctUsage, error) {
	s.fleet.mu.Lock()
	a := s.fleet.accts[accountID]
	s.fleet.mu.Unlock()
	if a == nil {
		used, err := s.readUsed(ctx, rs)
		if err != nil {
			return nil, err
		}
		s.fleet.mu.Lock()
		if s.fleet.accts == nil {
			s.fleet.accts = map[string]*acctUsage{}
		}
		if a = s.fleet.accts[accountID]; a == nil {
			a = &acctUsage{at: time.Now(), used: used}
			s.fleet.accts[accountID] = a
		}
		s.fleet.mu.Unlock()
		return a, nil
	}
	a.mu.Lock()
	if !a.refreshing && time.Since(a.at) >= fleetUsageTTL && s.fleetRefresh(a, rs) {
		a.refreshing = true
	}
	a.mu.Unlock()
	return a, nil
}

// fleetRefresh reads the counters of rs again into a in a goroutine the
// Server's Close waits for; false when closing.
func (s *Server) fleetRefresh(a *acctUsage, rs []runnerprov.Info) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.closed, 30*time.Second)
		defer cancel()
		used, err := s.readUsed(ctx, rs)
		a.mu.Lock()
		defer a.mu.Unlock()
		a.refreshing = false
		if err == nil {
			a.used, a.at = used, time.Now()
		}
	}()
	return true
}

// readUsed reads what each of rs holds from the store's counters (one
// query, one row a runner: never the records).
func (s *Server) readUsed(ctx context.Context, rs []runnerprov.Info) (map[string]runnerprov.Used, error) {
	prefixes := make([]string, 0, len(rs))
	ids := make(map[string]string, len(rs))
	for _, r := range rs {
		p, err := runnerprov.NamesPrefix(r.ID)
		if err != nil {
			continue
		}
		prefixes = append(prefixes, p)
		ids[p] = r.ID
	}
	got, err := s.cfg.Store.Usages(ctx, runnerprov.Name, prefixes)
	if err != nil {
		return nil, err
	}
	used := make(map[string]runnerprov.Used, len(got))
	for p, u := range got {
		used[ids[p]] = runnerprov.Used(u)
	}
	return used, nil
}

// noteUsed sets (truth) or adds to (a placement) what a runner holds in
// the account's table.
func (a *acctUsage) noteUsed(runnerID string, u runnerprov.Used, add bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if add {
		o := a.used[runnerID]
		u.MemoryBytes += o.MemoryBytes
		u.CPUMillis += o.CPUMillis
		u.DiskBytes += o.DiskBytes
		u.Sandboxes += o.Sandboxes
	}
	a.used[runnerID] = u
}

// schedulesOf are the account's runner schedules by runner id.
func (s *Server) schedulesOf(ctx context.Context, accountID string) (map[string]store.RunnerSchedule, error) {
	list, err := s.cfg.Store.RunnerSchedules(ctx, accountID)
	if err != nil {
		return nil, err
	}
	out := make(map[string]store.RunnerSchedule, len(list))
	for _, r := range list {
		out[r.RunnerID] = r
	}
	return out, nil
}

// lastRunner is the runner of the account's most recently made sandbox
// on the runner provider, "" when none.
func (s *Server) lastRunner(ctx context.Context, accountID string) string {
	recs, err := s.cfg.Store.ListSandboxes(ctx, accountID)
	if err != nil {
		return ""
	}
	var best store.Sandbox
	for _, r := range recs {
		if r.Provider == runnerprov.Name && r.CreatedAt.After(best.CreatedAt) {
			best = r
		}
	}
	id, _ := runnerprov.Parse(best.ProviderName)
	return id
}

// roomOf is what a runner's capacity report lets its records ask.
func roomOf(info runnerprov.Info, prefix string) store.Room {
	r := store.Room{Provider: runnerprov.Name, Prefix: prefix}
	if c := info.Capacity; c != nil {
		r.MemoryBytes, r.CPUMillis, r.DiskBytes, r.Sandboxes = c.MemoryBytes, int64(c.CPUs)*1000, c.DiskBytes, int64(c.MaxSandboxes)
	}
	return r
}

// placeErr is a placement refusal as the API answers it: 403
// denied{no_runner_fits} or denied{resource_exhausted}, naming what did
// not fit on each runner.
func placeErr(err error) error {
	var nf *runnerprov.NoFitError
	if errors.As(err, &nf) {
		return &apiError{http.StatusForbidden, &Error{Kind: "denied", Reason: nf.Reason, Message: nf.Error()}}
	}
	return err
}

// place inserts rec (its ProviderName set here) on the runner the policy
// puts first whose room still holds, through insert (which inserts
// within the room, or answers a *store.NoRoomError).
func (s *Server) place(ctx context.Context, rec store.Sandbox, rp *runnerprov.Provider, insert func(context.Context, store.Sandbox, store.Room) error) (store.Sandbox, error) {
	pl := placementOf(ctx)
	scheds, err := s.schedulesOf(ctx, rec.AccountID)
	if err != nil {
		return rec, err
	}
	rs, err := rp.Runners(ctx)
	if err != nil {
		return rec, err
	}
	if len(rs) == 0 {
		return rec, sandbox.Unavailable("no_runner_online", nil)
	}
	tab, err := s.usageOf(ctx, rec.AccountID, rs)
	if err != nil {
		return rec, err
	}
	req := runnerprov.PlaceRequest{Limits: rec.Limits, Selector: pl.Selector, Limit: maxPlaceTries,
		Used: func(id string) runnerprov.Used { return tab.used[id] }}
	if len(scheds) > 0 {
		req.Schedule = func(id string) string { return scheds[id].State }
		req.Labels = func(id string) map[string]string { return scheds[id].Labels }
	}
	if pl.PreferLast {
		req.Prefer = s.lastRunner(ctx, rec.AccountID)
	}
	tab.mu.Lock() // Used reads the table
	cs, err := runnerprov.PlaceOnline(rs, req)
	tab.mu.Unlock()
	if err != nil {
		return rec, placeErr(err)
	}
	var miss []runnerprov.RunnerMiss
	for _, c := range cs {
		prefix, err := runnerprov.NamesPrefix(c.Info.ID)
		if err != nil {
			return rec, err
		}
		if rec.ProviderName, err = runnerprov.For(c.Info.ID); err != nil {
			return rec, err
		}
		err = insert(ctx, rec, roomOf(c.Info, prefix))
		var nr *store.NoRoomError
		if errors.As(err, &nr) {
			// Filled under us (another replica, or this table is old):
			// learn the truth and try the next.
			miss = append(miss, runnerprov.RunnerMiss{Runner: c.Info.Name, ID: c.Info.ID, Why: nr.Error()})
			if u, uerr := s.cfg.Store.UsageOf(ctx, runnerprov.Name, prefix); uerr == nil {
				tab.noteUsed(c.Info.ID, runnerprov.Used(u), false)
			}
			continue
		}
		if err != nil {
			return rec, err
		}
		tab.noteUsed(c.Info.ID, runnerprov.Used{MemoryBytes: rec.Limits.MemoryBytes, CPUMillis: int64(rec.Limits.CPUMillis),
			DiskBytes: rec.Limits.DiskBytes, Sandboxes: 1}, true)
		return rec, nil
	}
	return rec, placeErr(&runnerprov.NoFitError{Reason: "resource_exhausted", Why: miss})
}

// insertPlaced is Create's insert of a runner sandbox's record: the
// account's bound (MaxSandboxesPerAccount, as insertCounted) and the
// runner's room, counted under the account's lock.
func (s *Server) insertPlaced(ctx context.Context, rec store.Sandbox, rp *runnerprov.Provider) (store.Sandbox, error) {
	return s.place(ctx, rec, rp, func(ctx context.Context, rec store.Sandbox, room store.Room) error {
		defer s.lock(rec.AccountID, "")() // "" is no sandbox's name
		if err := s.underQuota(ctx, rec.AccountID); err != nil {
			return err
		}
		return s.cfg.Store.InsertSandboxWithin(ctx, rec, room)
	})
}

// underQuota refuses a create of one more sandbox than the account may
// hold (MaxSandboxesPerAccount): 403 denied{resource_exhausted}. It counts
// the account's records (store.CountSandboxes), never lists them; the
// caller holds the account's lock.
func (s *Server) underQuota(ctx context.Context, accountID string) error {
	n, err := s.cfg.Store.CountSandboxes(ctx, accountID)
	if err != nil {
		return err
	}
	if n >= s.cfg.MaxSandboxesPerAccount {
		return &apiError{http.StatusForbidden, &Error{Kind: "denied", Reason: "resource_exhausted",
			Message: fmt.Sprintf("resource_exhausted: the account holds %d sandboxes, the most it may (serve --sandboxes-per-account); destroy one first", n)}}
	}
	return nil
}

// RunnerView is one runner of GET /v1/runners: its Info (labels and
// capacity as the daemon reports them) when online, and what the
// platform keeps of it: its schedule, the operator's labels, and what its
// records hold.
type RunnerView struct {
	runnerprov.Info
	Online         bool              `json:"online"`
	Schedule       string            `json:"schedule,omitempty"` // cordoned, draining
	OperatorLabels map[string]string `json:"operator_labels,omitempty"`
	Used           RunnerUsed        `json:"used"`
}

// RunnerUsed is what a runner's sandbox records ask together.
type RunnerUsed struct {
	MemoryBytes int64 `json:"memory_bytes"`
	CPUMillis   int64 `json:"cpu_millis"`
	DiskBytes   int64 `json:"disk_bytes"`
	Sandboxes   int64 `json:"sandboxes"`
}

// fleetViews lists the account's runners: online ones, and those the
// store knows (records, schedules) while offline.
func (s *Server) fleetViews(ctx context.Context, accountID string) ([]RunnerView, error) {
	var online []runnerprov.Info
	if s.cfg.Runners != nil {
		var err error
		if online, err = AccountRunners(s.cfg.Runners, accountID).Runners(ctx); err != nil {
			return nil, err
		}
	}
	scheds, err := s.schedulesOf(ctx, accountID)
	if err != nil {
		return nil, err
	}
	recs, err := s.cfg.Store.ListSandboxes(ctx, accountID)
	if err != nil {
		return nil, err
	}
	used := countUsed(recs)
	seen := map[string]bool{}
	var out []RunnerView
	add := func(i runnerprov.Info, on bool) {
		if seen[i.ID] {
			return
		}
		seen[i.ID] = true
		sc := scheds[i.ID]
		out = append(out, RunnerView{Info: i, Online: on, Schedule: sc.State, OperatorLabels: sc.Labels, Used: RunnerUsed(used[i.ID])})
	}
	for _, i := range online {
		add(i, true)
	}
	if known, err := s.cfg.Store.ListRunners(ctx, accountID); err == nil {
		for _, r := range known {
			add(runnerprov.Info{ID: r.ID, Account: accountID, Name: r.Name}, false)
		}
	}
	for _, sc := range scheds {
		add(runnerprov.Info{ID: sc.RunnerID, Account: accountID, Name: sc.Name}, false)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// fleetRunners is GET /v1/runners.
func (s *Server) fleetRunners(w http.ResponseWriter, r *http.Request, k store.Key) {
	out, err := s.fleetViews(r.Context(), k.AccountID)
	if err != nil {
		writeErr(w, err)
		return
	}
	if out == nil {
		out = []RunnerView{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
}

// runnerNamed finds the account's runner by name (or id).
func (s *Server) runnerNamed(ctx context.Context, accountID, name string) (RunnerView, error) {
	vs, err := s.fleetViews(ctx, accountID)
	if err != nil {
		return RunnerView{}, err
	}
	for _, v := range vs {
		if v.Name == name {
			return v, nil
		}
	}
	for _, v := range vs {
		if v.ID == name {
			return v, nil
		}
	}
	return RunnerView{}, fmt.Errorf("runner %q: %w", clipName(name), sandbox.ErrNotFound)
}

func clipName(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// setSchedule records state for the runner named in the path and answers
// the runner's view.
func (s *Server) setSchedule(w http.ResponseWriter, r *http.Request, k store.Key, state string) (RunnerView, bool) {
	v, err := s.runnerNamed(r.Context(), k.AccountID, r.PathValue("runner"))
	if err != nil {
		writeErr(w, err)
		return v, false
	}
	if err := s.cfg.Store.SetRunnerSchedule(r.Context(), store.RunnerSchedule{AccountID: k.AccountID, RunnerID: v.ID, Name: v.Name,
		State: state, Labels: v.OperatorLabels, UpdatedAt: s.cfg.Now().UTC()}); err != nil {
		writeErr(w, err)
		return v, false
	}
	v.Schedule = state
	return v, true
}

// runnerCordon is POST /v1/runners/{runner}/cordon.
func (s *Server) runnerCordon(w http.ResponseWriter, r *http.Request, k store.Key) {
	if v, ok := s.setSchedule(w, r, k, store.ScheduleCordoned); ok {
		writeJSON(w, http.StatusOK, v)
	}
}

// runnerUncordon is POST /v1/runners/{runner}/uncordon.
func (s *Server) runnerUncordon(w http.ResponseWriter, r *http.Request, k store.Key) {
	if v, ok := s.setSchedule(w, r, k, ""); ok {
		writeJSON(w, http.StatusOK, v)
	}
}

// LabelsRequest is POST /v1/runners/{runner}/labels: the operator's
// labels of the runner ("" as a value removes that label).
type LabelsRequest struct {
	Labels map[string]string `json:"labels"`
}

// runnerLabels is POST /v1/runners/{runner}/labels.
func (s *Server) runnerLabels(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req LabelsRequest
	if err := s.decode(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	v, err := s.runnerNamed(r.Context(), k.AccountID, r.PathValue("runner"))
	if err != nil {
		writeErr(w, err)
		return
	}
	next := map[string]string{}
	for key, val := range v.OperatorLabels {
		next[key] = val
	}
	for key, val := range req.Labels {
		if val == "" {
			delete(next, key)
			continue
		}
		if err := wire.CheckLabel(key, val); err != nil {
			writeErr(w, badJSON("labels", err.Error()))
			return
		}
		next[key] = val
	}
	if len(next) > wire.MaxLabels {
		writeErr(w, badJSON("labels", fmt.Sprintf("more than %d labels", wire.MaxLabels)))
		return
	}
	if err := s.cfg.Store.SetRunnerSchedule(r.Context(), store.RunnerSchedule{AccountID: k.AccountID, RunnerID: v.ID, Name: v.Name,
		State: v.Schedule, Labels: next, UpdatedAt: s.cfg.Now().UTC()}); err != nil {
		writeErr(w, err)
		return
	}
	v.OperatorLabels = next
	writeJSON(w, http.StatusOK, v)
}

// DrainRequest is POST /v1/runners/{runner}/drain: with Wait the
// runner's sandboxes are only waited for (their users destroy or move
// them); without, each is parked as an idle one would be (suspended where
// the runner can, else destroyed and made again on its next use).
type DrainRequest struct {
	Wait bool `json:"wait,omitempty"`
}

// DrainStatus is drain's answer: the runner (now draining), each sandbox
// still on it and what became of it in this pass, and how many remain
// (not parked).
type DrainStatus struct {
	Runner    RunnerView  `json:"runner"`
	Sandboxes []DrainItem `json:"sandboxes"`
	Remaining int         `json:"remaining"`
}

// DrainItem is one sandbox of a drain.
type DrainItem struct {
	Name   string `json:"name"`
	State  string `json:"state"`
	Action string `json:"action"` // parked, already_parked, waiting, busy, failed
	Detail string `json:"detail,omitempty"`
}

// runnerDrain is POST /v1/runners/{runner}/drain: cordons the runner
// (draining) and makes one pass over its sandboxes; a client calls it
// again until remaining is 0.
func (s *Server) runnerDrain(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req DrainRequest
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &req); err != nil {
			writeErr(w, err)
			return
		}
	}
	v, ok := s.setSchedule(w, r, k, store.ScheduleDraining)
	if !ok {
		return
	}
	recs, err := s.cfg.Store.ListSandboxes(r.Context(), k.AccountID)
	if err != nil {
		writeErr(w, err)
		return
	}
	st := DrainStatus{Runner: v, Sandboxes: []DrainItem{}}
	for _, rec := range recs {
		if rec.Provider != runnerprov.Name {
			continue
		}
		if id, err := runnerprov.Parse(rec.ProviderName); err != nil || id != v.ID {
			continue
		}
		it := DrainItem{Name: rec.Name, State: rec.State}
		switch {
		case rec.State == store.StateParked:
			it.Action = "already_parked"
		case req.Wait:
			it.Action = "waiting"
		case !v.Online:
			it.Action, it.Detail = "waiting", "the runner is offline"
		default:
			cur, err := s.Park(r.Context(), rec, s.cfg.Now().Add(time.Hour))
			it.State = cur.State
			switch {
			case err == nil:
				it.Action = "parked"
			case errors.Is(err, store.ErrConflict):
				it.Action, it.Detail = "busy", "in use or being parked: asked again on the next pass"
			default:
				it.Action, it.Detail = "failed", err.Error()
			}
		}
		if it.State != store.StateParked {
			st.Remaining++
		}
		st.Sandboxes = append(st.Sandboxes, it)
	}
	writeJSON(w, http.StatusOK, st)
}

// markRunnerOffline sets the view state of each record whose runner is
// not online to runner_offline (the record itself is unchanged: the
// sandbox is as it was when the runner comes back).
func (s *Server) markRunnerOffline(ctx context.Context, accountID string, recs []store.Sandbox, out []Sandbox) {
	if s.cfg.Runners == nil {
		return
	}
	var online map[string]bool
	for i, rec := range recs {
		if rec.Provider != runnerprov.Name || rec.State == store.StateParked && rec.ParkedBy == store.ParkDestroy {
			continue
		}
		if online == nil {
			rs, err := AccountRunners(s.cfg.Runners, accountID).Runners(ctx)
			if err != nil {
				return
			}
			online = make(map[string]bool, len(rs))
			for _, r := range rs {
				online[r.ID] = true
			}
		}
		if id, err := runnerprov.Parse(rec.ProviderName); err == nil && !online[id] {
			out[i].State = StateRunnerOffline
		}
	}
}

// offlineView makes v say runner_offline (status unknown) when err is
// the runner provider's Unavailable{runner_offline} for rec: a GET of a
// sandbox whose runner vanished answers its record at once, as the
// listing does, instead of 503.
func offlineView(rec store.Sandbox, err error, v *Sandbox) bool {
	var un *sandbox.UnavailableError
	if rec.Provider != runnerprov.Name || !errors.As(err, &un) || un.Reason != runnerprov.ReasonOffline {
		return false
	}
	v.State, v.Status = StateRunnerOffline, string(sandbox.StatusUnknown)
	return true
}

// StateRunnerOffline is the state a listing and a GET give a sandbox
// whose runner is not connected.
const StateRunnerOffline = "runner_offline"

// parseSelector reads a create's runner_selector.
func parseSelector(s string) (runnerprov.Selector, error) {
	sel, err := runnerprov.ParseSelector(strings.TrimSpace(s))
	if err != nil {
		return nil, badJSON("runner_selector", err.Error())
	}
	return sel, nil
}

// EnrolLabels records labels, set when runner name of the account called
// accountName is enrolled (managoat enroll --label), as the runner's
// operator labels in st (its runner schedule), so they hold across
// replicas and restarts as those of POST /v1/runners/{runner}/labels do.
// The rule: these labels are over the operator labels the runner had (an
// enrolment again with --label changes the keys it names, keeps the
// others), and every operator label is over the daemon's own --label of
// the same key when the platform places (Place's effective labels). A
// label with an empty value ("k=") removes the operator's k. Malformed labels are sandbox.Invalid naming the label; st is left
// unchanged. The runner's record (its id) is made here when its first
// connection has not made it yet, as the enrolment's claim; an account
// without a record of that name is the name itself, as RunnerAuth maps
// the runners file's account names.
func EnrolLabels(ctx context.Context, st store.Store, accountName, name string, labels map[string]string) error {
	if len(labels) == 0 {
		return nil
	}
	if len(labels) > wire.MaxLabels {
		return sandbox.Invalid("labels", fmt.Sprintf("more than %d labels", wire.MaxLabels))
	}
	for k, v := range labels {
		if err := wire.CheckLabel(k, v); err != nil {
			return sandbox.Invalid("labels", err.Error())
		}
	}
	acct := accountName
	if ac, err := st.AccountByName(ctx, accountName); err == nil {
		acct = ac.ID
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	id, err := (RunnerAuth{Store: st}).claim(ctx, acct, name, "")
	if err != nil {
		return err
	}
	scheds, err := st.RunnerSchedules(ctx, acct)
	if err != nil {
		return err
	}
	var sch store.RunnerSchedule
	for _, s := range scheds {
		if s.RunnerID == id {
			sch = s
		}
	}
	next := map[string]string{}
	for k, v := range sch.Labels {
		next[k] = v
	}
	for k, v := range labels {
		if v == "" {
			delete(next, k) // "k=" removes an operator label, as POST labels does
			continue
		}
		next[k] = v
	}
	if len(next) > wire.MaxLabels {
		return sandbox.Invalid("labels", fmt.Sprintf("more than %d labels with the runner's operator labels", wire.MaxLabels))
	}
	return st.SetRunnerSchedule(ctx, store.RunnerSchedule{AccountID: acct, RunnerID: id, Name: name,
		State: sch.State, Labels: next, UpdatedAt: time.Now().UTC()})
}

// wakeFits refuses the wake of a runner's sandbox parked by destroy (a
// fresh create on its runner; such a record is not counted on the runner
// while parked) when the runner no longer has room for it: its reported
// capacity minus what the other records on it ask. The refusal is
// placement's, 403 denied{resource_exhausted} naming the runner and what
// did not fit, and the record stays parked; a later wake tries again. A
// sandbox parked by suspend is counted on its runner while parked and
// needs no check; a runner offline is the create's unavailable. The check
// is made under the sandbox's lock, not in one transaction with the
// record's write (the store has no UpdateSandboxWithin yet), so a create
// placed on the runner at the same instant may still pass its room.
func (s *Server) wakeFits(ctx context.Context, rec store.Sandbox, p sandbox.Provider) error {
	rp, ok := p.(*runnerprov.Provider)
	if !ok || rec.ParkedBy != store.ParkDestroy {
		return nil
	}
	id, err := runnerprov.Parse(rec.ProviderName)
	if err != nil {
		return nil
	}
	rs, err := rp.Runners(ctx)
	if err != nil {
		return err
	}
	for _, info := range rs {
		if info.ID != id {
			continue
		}
		prefix, err := runnerprov.NamesPrefix(id)
		if err != nil {
			return err
		}
		u, err := s.cfg.Store.UsageOf(ctx, runnerprov.Name, prefix)
		if err != nil {
			return err
		}
		if err := roomOf(info, prefix).Fits(u, rec); err != nil {
			return placeErr(&runnerprov.NoFitError{Reason: "resource_exhausted",
				Why: []runnerprov.RunnerMiss{{Runner: info.Name, ID: id, Why: "waking " + rec.Name + ": " + err.Error()}}})
		}
		return nil
	}
	return nil
}
