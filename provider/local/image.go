package local

import (
	"context"
	"fmt"
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
	return s.Use(img, iid)
}

// releaseImage undoes withImage's use mark of sandbox iid.
func (p *Provider) releaseImage(iid string) {
	if s, err := p.Images(); err == nil {
		s.Release(iid)
	}
}
