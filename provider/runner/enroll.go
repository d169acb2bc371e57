package runner

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/sandbox"
)

// RunnerAuthenticator decides whether key is the credential of the runner
// that names itself name, and names the account that runner belongs to.
// With ServerConfig.RunnerAuth set, a runner proves it is the runner it
// says with its own credential, and no client key can connect a runner:
// a holder of the platform's client key cannot pose as a runner, take a
// real runner's name after deleting it, or be given the next sandbox.
type RunnerAuthenticator interface {
	AuthenticateRunner(r *http.Request, key, name string) (account string, err error)
}

// RunnerIdentifier is a RunnerAuthenticator that also names the id of the
// runner it admits: an id made at random when the name was enrolled (or
// first claimed) and kept with it, never derived from the account and the
// name, so nobody who can name a runner can compute where its sandboxes
// route. The Server uses it in place of ServerConfig.RunnerID; an empty
// id falls back to RunnerID.
type RunnerIdentifier interface {
	RunnerAuthenticator
	IdentifyRunner(r *http.Request, key, name string) (account, id string, err error)
}

// NewRunnerID returns a random runner id (a version 4 UUID, dashed).
func NewRunnerID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return dashed(hex.EncodeToString(b[:]))
}

// RunnerFile is a RunnerAuthenticator over a file of enrolled runners
// (Enroll writes it): each entry binds a runner's name to its account and
// to the SHA-256 of its credential; the credential itself is stored
// nowhere. The file is read at each connection, so an enrolment or a
// revocation takes effect on the runner's next connection without a
// restart; a runner whose credential is revoked keeps its open socket
// until it reconnects (DELETE the runner to close it).
type RunnerFile struct{ Path string }

// enrolled is one entry of the file. ID is the runner's id, random at
// its enrolment and kept across a rotation; an entry written before ids
// were (none) gets StableID's.
type enrolled struct {
	Name       string    `json:"name"`
	ID         string    `json:"id,omitempty"`
	Account    string    `json:"account"`
	SHA256     string    `json:"sha256"`
	EnrolledAt time.Time `json:"enrolled_at"`
}

type runnersFile struct {
	Runners []enrolled `json:"runners"`
}

// ErrAlreadyEnrolled is Enroll's answer for a name that has a credential.
var ErrAlreadyEnrolled = fmt.Errorf("runner: a runner of that name is enrolled already (rotating its credential replaces it): %w", sandbox.ErrAlreadyExists)

// AuthenticateRunner implements RunnerAuthenticator: key must be the
// credential enrolled for name (compared in constant time).
func (f RunnerFile) AuthenticateRunner(r *http.Request, key, name string) (string, error) {
	a, _, err := f.IdentifyRunner(r, key, name)
	return a, err
}

// IdentifyRunner implements RunnerIdentifier: AuthenticateRunner, and the
// id the enrolment keeps.
func (f RunnerFile) IdentifyRunner(_ *http.Request, key, name string) (string, string, error) {
	rf, err := readRunners(f.Path)
	if err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	sum := sha256.Sum256([]byte(key))
	got := hex.EncodeToString(sum[:])
	for _, e := range rf.Runners {
		if e.Name == name && key != "" && subtle.ConstantTimeCompare([]byte(got), []byte(e.SHA256)) == 1 {
			id := e.ID
			if id == "" {
				id = StableID(e.Account, e.Name)
			}
			return e.Account, id, nil
		}
	}
	return "", "", ErrUnauthorized
}

// Enroll makes a credential for the runner called name in account and
// records its hash in the file at path (created 0600 if missing). It
// returns the credential, which is shown once and stored nowhere: the
// runner reads it from a file or the environment. A name enrolled already
// is ErrAlreadyEnrolled unless rotate, which replaces its credential.
func Enroll(path, name, account string, rotate bool) (string, error) {
	if !validRunnerName(name) {
		return "", fmt.Errorf("runner name %q must be lowercase letters, digits, dots, dashes or underscores (max 63)", clip(name, 80))
	}
	if account == "" {
		account = "local"
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	secret := "mgr_" + base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(secret))
	err := updateRunners(path, func(rf *runnersFile) error {
		id := NewRunnerID()
		for i, e := range rf.Runners {
			if e.Name == name {
				if !rotate {
					return ErrAlreadyEnrolled
				}
				if e.ID != "" && e.Account == account {
					id = e.ID // a rotation keeps the runner's id, so its sandboxes keep routing
				}
				rf.Runners = append(rf.Runners[:i], rf.Runners[i+1:]...)
				break
			}
		}
		rf.Runners = append(rf.Runners, enrolled{Name: name, ID: id, Account: account, SHA256: hex.EncodeToString(sum[:]), EnrolledAt: time.Now().UTC()})
		return nil
	})
	if err != nil {
		return "", err
	}
	return secret, nil
}

// Revoke removes name's credential from the file; a name not enrolled is
// not an error.
func Revoke(path, name string) error {
	return updateRunners(path, func(rf *runnersFile) error {
		for i, e := range rf.Runners {
			if e.Name == name {
				rf.Runners = append(rf.Runners[:i], rf.Runners[i+1:]...)
				return nil
			}
		}
		return nil
	})
}

func readRunners(path string) (*runnersFile, error) {
	var rf runnersFile
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &rf, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &rf); err != nil {
		return nil, fmt.Errorf("runners file %s: %w", path, err)
	}
	return &rf, nil
}

// updateRunners changes the file under a lock on its directory, writing a
// new file and renaming it over the old one.
func updateRunners(path string, change func(*runnersFile) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock, err := flock.Lock(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	rf, err := readRunners(path)
	if err != nil {
		return err
	}
	if err := change(rf); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rf, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".runners-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
