package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/sandbox"
)

// Images is the provider's image store (state directory's images/): the
// images CreateOptions.Image names are pulled into it once and shared by
// every sandbox on them.
func (p *Provider) Images() (*image.Store, error) {
	return image.Open(filepath.Join(p.state, "images"))
}

// runsImages reports whether the mechanism can run a sandbox on an image
// root (the jail and the OCI runtimes; trusted has no root of its own).
func runsImages(m mechanism.Mechanism) bool {
	n := m.Name()
	return n == "jail" || strings.HasPrefix(n, "oci")
}

// withImage puts the image opts.Image names (pulled when the store lacks
// it) under spec: its root, its user, its Env before the caller's, and
// its WorkingDir as the default directory unless opts.Dir says one; the
// sandbox iid is recorded as using it.
func (p *Provider) withImage(ctx context.Context, iid string, spec *mechanism.Spec, opts *sandbox.CreateOptions) error {
	if opts.Image == "" {
		return nil
	}
	if !runsImages(p.mech) {
		return sandbox.Invalid("image", fmt.Sprintf("mechanism %s runs no images (the jail and oci do)", p.mech.Name()))
	}
	s, err := p.Images()
	if err != nil {
		return err
	}
	img, err := s.Ensure(ctx, opts.Image, image.PullOptions{})
	if err != nil {
		return err
	}
	uid, gid, err := image.ResolveUser(img.Root, img.Config.User)
	if err != nil {
		return err
	}
	spec.Image = &mechanism.ImageRoot{Dir: img.Root, Ref: img.Ref, Digest: img.Digest, UID: uid, GID: gid}
	spec.Env = append(append([]string{}, img.Config.Env...), spec.Env...)
	if opts.Dir == "" {
		opts.Dir = img.Config.WorkingDir
	}
	if err := seedHome(ctx, img, spec.HomeDir); err != nil {
		return err
	}
	return s.Use(img, iid)
}

// seedHome copies the image's /home/sprite (what Commit saved of a
// sandbox's home) into the new sandbox's home, which the mechanism binds
// over it.
func seedHome(ctx context.Context, img *image.Image, home string) error {
	src, err := openDir(filepath.Join(img.Root, mechanism.Home))
	if err != nil {
		return nil // the image has no home of ours
	}
	defer src.Close()
	if err := os.MkdirAll(home, 0o755); err != nil {
		return stateErr("create home", err)
	}
	dst, err := openDir(home)
	if err != nil {
		return stateErr("create home", err)
	}
	defer dst.Close()
	if err := copyDir(ctx, src, dst, 0); err != nil {
		return stateErr("seed home from the image", err)
	}
	return nil
}

// Commit saves sandbox h's prepared environment as the image ref in the
// provider's store: the image it runs on plus its home (what it
// installed with pip --user, npm, or wrote there), so a Create with
// Image: ref starts the next sandbox from it, home included. A sandbox
// made without an image is Invalid{commit}.
func (p *Provider) Commit(ctx context.Context, h *sandbox.Handle, ref string) (*image.Image, error) {
	r, _, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	s, err := p.Images()
	if err != nil {
		return nil, err
	}
	base, err := s.UsedBy(r.InstanceID)
	if err != nil {
		return nil, sandbox.Invalid("commit", fmt.Sprintf("sandbox %q runs on no image (create it with an image to commit it)", h.Name))
	}
	dir := image.CommitDir{Src: p.homeDir(r.InstanceID), Path: mechanism.Home}
	if m, err := p.mechFor(r); err == nil {
		if ranged, ok := m.(idRanger); ok {
			// The layer holds the ids the sandbox saw, not its range's.
			if dir.IDBase, dir.IDSize, err = ranged.IDRange(r.InstanceID); err != nil {
				return nil, err
			}
		}
	}
	return s.Commit(ctx, base, []image.CommitDir{dir}, ref)
}

// idRanger is a mechanism whose sandboxes may have a range of host ids of
// their own (the jail's user namespaces): base 0 when this one has none.
type idRanger interface {
	IDRange(id string) (base, size int, err error)
}

// releaseImage undoes withImage's use mark of sandbox iid.
func (p *Provider) releaseImage(iid string) {
	if s, err := p.Images(); err == nil {
		s.Release(iid)
	}
}
