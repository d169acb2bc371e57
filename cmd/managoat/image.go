package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

func init() {
	register("image", "pull|load|save|ls|rm|prune [flags] [REF...]", "Manage the images local sandboxes run on (--image): pull, load and save archives (offline), list, remove, prune", cmdImage)
	register("commit", "[flags] NAME REF", "Save a local sandbox made with --image, home included, as the image REF for the next sandboxes", cmdCommit)
}

// committer is a provider that saves a sandbox as an image (local).
type committer interface {
	Commit(ctx context.Context, h *sandbox.Handle, ref string) (*image.Image, error)
}

func cmdCommit(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
	return func(ctx context.Context, args []string) error {
		_, h, pos, err := sandboxArgs(g, fs, args, 2, "NAME and REF")
		if err != nil {
			return err
		}
		if err := of.check(); err != nil {
			return err
		}
		_, p, err := openProvider(g.provider)
		if err != nil {
			return err
		}
		c, ok := p.(committer)
		if !ok {
			return &sandbox.InvalidError{Reason: "commit", Msg: fmt.Sprintf("provider %s saves no sandbox as an image; commit is the local provider's", g.provider)}
		}
		img, err := c.Commit(ctx, h, pos[1])
		if err != nil {
			return wrap("commit "+h.Name, err)
		}
		if of.json() {
			return json.NewEncoder(os.Stdout).Encode(imageJSON(img))
		}
		fmt.Printf("%s %s %s\n", img.Ref, img.Digest, mib(img.Size))
		return nil
	}
}

// imageStore is the local provider's image store (its state directory's
// images/), which run and create --image pull into.
func imageStore() (*image.Store, error) {
	return image.Open(filepath.Join(local.DefaultStateDir(), "images"))
}

// imageFlag defines run's and create's --image.
func imageFlag(fs *flag.FlagSet) *string {
	return fs.String("image", "", "run the sandbox on the OCI image `REF` (pulled when not in the store; local provider, jail or oci)")
}

// ensureImage checks that the provider runs images and pulls ref into the
// store (with progress on a terminal) unless it is there; the provider's
// Create then finds it. It returns the image, whose config run uses when
// it is given no command.
func ensureImage(ctx context.Context, g *globals, ref string) (*image.Image, error) {
	if g.provider != "local" {
		return nil, &sandbox.InvalidError{Reason: "image", Msg: fmt.Sprintf("provider %s chooses its own images; --image is the local provider's", g.provider)}
	}
	s, err := imageStore()
	if err != nil {
		return nil, err
	}
	if img, err := s.Get(ref); err == nil {
		return img, nil
	}
	return pullImage(ctx, s, ref, image.PullOptions{})
}

func pullImage(ctx context.Context, s *image.Store, ref string, opts image.PullOptions) (*image.Image, error) {
	pr := newPullProgress(ref)
	opts.Progress = pr.update
	img, err := s.Pull(ctx, ref, opts)
	pr.stop()
	if err != nil {
		return nil, wrap("pull "+ref, cliBound(err))
	}
	return img, nil
}

// boundFlags are image pull's and image load's --max-bytes and
// --max-entries (image.PullOptions.MaxBytes, MaxEntries).
type boundFlags struct{ bytes, entries string }

func (b *boundFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&b.bytes, "max-bytes", "", fmt.Sprintf("pull or load: refuse an image whose layers download, or unpack to, more than `SIZE` (default %dG; none: no bound)", image.DefaultMaxBytes>>30))
	fs.StringVar(&b.entries, "max-entries", "", fmt.Sprintf("pull or load: refuse an image whose layers hold more than `N` files, directories and links (default %d; none: no bound)", image.DefaultMaxEntries))
}

func (b *boundFlags) apply(o *image.PullOptions) error {
	if b.bytes == "none" {
		o.MaxBytes = -1
	} else if b.bytes != "" {
		n, err := parseSize(b.bytes)
		if err != nil {
			return usageError{msg: "--max-bytes: " + err.Error()}
		}
		o.MaxBytes = n
	}
	if b.entries == "none" {
		o.MaxEntries = -1
	} else if b.entries != "" {
		n, err := strconv.ParseInt(b.entries, 10, 64)
		if err != nil || n <= 0 {
			return usageError{msg: fmt.Sprintf("--max-entries: %q is not a positive count", b.entries)}
		}
		o.MaxEntries = n
	}
	return nil
}

// boundError is an image.BoundError said in the CLI's terms: the flag
// that raises the bound.
type boundError struct{ err error }

func (e boundError) Error() string {
	msg := e.err.Error()
	msg = strings.Replace(msg, "PullOptions.MaxBytes", "--max-bytes of image pull and image load", 1)
	return strings.Replace(msg, "PullOptions.MaxEntries", "--max-entries of image pull and image load", 1)
}

func (e boundError) Unwrap() error { return e.err }

func cliBound(err error) error {
	var be *image.BoundError
	if errors.As(err, &be) {
		return boundError{err}
	}
	return err
}

// pullProgress draws one line on a terminal's stderr: the layers done, the
// bytes downloaded of the layers' total, a bar. Written here: it is one
// line, like the spinner, and needs no terminal library.
type pullProgress struct {
	ref    string
	tty    bool
	mu     sync.Mutex
	layers map[string]image.Progress
	last   time.Time
	drawn  bool
}

func newPullProgress(ref string) *pullProgress {
	return &pullProgress{ref: ref, tty: isTerminal(os.Stderr), layers: map[string]image.Progress{}}
}

func (p *pullProgress) update(u image.Progress) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.layers[u.Layer] = u
	if time.Since(p.last) < 100*time.Millisecond && u.Done != u.Total {
		return
	}
	p.last = time.Now()
	var done, total int64
	complete, n := 0, u.N
	for _, l := range p.layers {
		done += l.Done
		total += l.Total
		if l.Done == l.Total {
			complete++
		}
	}
	const width = 24
	fill := 0
	if total > 0 {
		fill = int(done * width / total)
	}
	fmt.Fprintf(os.Stderr, "\r\033[Kpulling %s: layers %d/%d  %s / %s  [%s%s]", p.ref, complete, n,
		mib(done), mib(total), strings.Repeat("#", fill), strings.Repeat(" ", width-fill))
	p.drawn = true
}

func (p *pullProgress) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func cmdImage(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
	if f := fs.Lookup("o"); f != nil {
		f.Usage += "; image save: the FILE to write (as --output)"
	}
	var bounds boundFlags
	bounds.add(fs)
	input := fs.String("i", "", "image load: read the archive from `FILE` (a docker save tarball or an OCI layout tar) or an OCI layout directory; default stdin")
	fs.StringVar(input, "input", "", "image load: the same as -i `FILE`")
	output := fs.String("output", "", "image save: write the archive to `FILE` (default stdout)")
	format := fs.String("format", image.FormatOCI, "image save: the archive's `FORMAT`: oci (an OCI image layout tar, which skopeo and podman read as oci-archive:FILE) or docker (a docker save tarball, for docker load)")
	tag := fs.String("tag", "", "image load: name the archive's one image `REF` (needed when the archive names none)")
	return func(ctx context.Context, args []string) error {
		// Flags may come before the subcommand (--help among them), after
		// it and among its arguments.
		if err := parse(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			return usageError{msg: "missing pull, load, save, ls, rm or prune"}
		}
		sub := fs.Arg(0)
		var refs []string
		for rest := fs.Args()[1:]; ; rest = fs.Args()[1:] {
			if err := parse(fs, rest); err != nil {
				return err
			}
			if fs.NArg() == 0 {
				break
			}
			refs = append(refs, fs.Arg(0))
		}
		if sub == "save" && of.format != "" {
			if *output != "" && *output != of.format {
				return usageError{msg: "-o and --output name two files"}
			}
			*output, of.format = of.format, ""
		}
		if err := of.check(); err != nil {
			return err
		}
		s, err := imageStore()
		if err != nil {
			return err
		}
		switch sub {
		case "load":
			if err := noMore(refs); err != nil {
				return err
			}
			opts := image.LoadOptions{Ref: *tag}
			var po image.PullOptions
			if err := bounds.apply(&po); err != nil {
				return err
			}
			opts.MaxBytes, opts.MaxEntries = po.MaxBytes, po.MaxEntries
			imgs, err := loadImages(ctx, s, *input, opts)
			if err != nil {
				return err
			}
			for _, img := range imgs {
				if of.json() {
					if err := json.NewEncoder(os.Stdout).Encode(imageJSON(img)); err != nil {
						return err
					}
					continue
				}
				for _, r := range img.Refs {
					fmt.Printf("%s %s %s\n", r, img.Digest, mib(img.Size))
				}
			}
			return nil
		case "save":
			if len(refs) == 0 {
				return usageError{msg: "missing REF"}
			}
			if *format != image.FormatOCI && *format != image.FormatDocker {
				return usageError{msg: fmt.Sprintf("--format: %q is not oci or docker", *format)}
			}
			return saveImages(ctx, s, *output, *format, refs)
		case "pull":
			if len(refs) == 0 {
				return usageError{msg: "missing REF"}
			}
			var opts image.PullOptions
			if err := bounds.apply(&opts); err != nil {
				return err
			}
			for _, ref := range refs {
				img, err := pullImage(ctx, s, ref, opts)
				if err != nil {
					return err
				}
				if of.json() {
					if err := json.NewEncoder(os.Stdout).Encode(imageJSON(img)); err != nil {
						return err
					}
					continue
				}
				fmt.Printf("%s %s %s\n", img.Ref, img.Digest, mib(img.Size))
			}
			return nil
		case "ls":
			if err := noMore(refs); err != nil {
				return err
			}
			list, err := s.List()
			if err != nil {
				return err
			}
			if of.json() {
				out := []map[string]any{}
				for i := range list {
					out = append(out, imageJSON(&list[i]))
				}
				return json.NewEncoder(os.Stdout).Encode(out)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REF\tDIGEST\tSIZE\tPULLED")
			for _, img := range list {
				refs := img.Refs
				if len(refs) == 0 {
					refs = []string{"<none>"}
				}
				for _, r := range refs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r, shortDigest(img.Digest), mib(img.Size), img.PulledAt.Local().Format(time.DateTime))
				}
			}
			return tw.Flush()
		case "rm":
			if len(refs) == 0 {
				return usageError{msg: "missing REF"}
			}
			for _, ref := range refs {
				if err := s.Remove(ctx, ref); err != nil {
					return wrap("rm "+ref, err)
				}
			}
			return nil
		case "prune":
			if err := noMore(refs); err != nil {
				return err
			}
			res, err := s.Prune(ctx)
			if err != nil {
				return err
			}
			if of.json() {
				return json.NewEncoder(os.Stdout).Encode(map[string]any{"roots": res.Roots, "blobs": res.Blobs, "partial": res.Partial, "bytes": res.Bytes})
			}
			fmt.Printf("removed %d images, %d layers, %d partial pulls: %s\n", res.Roots, res.Blobs, res.Partial, mib(res.Bytes))
			return nil
		}
		return usageError{msg: fmt.Sprintf("unknown image command %q (pull, load, save, ls, rm, prune)", sub)}
	}
}

// loadImages loads the archive at path (a directory: an OCI layout), or
// from stdin when path is "" or "-".
func loadImages(ctx context.Context, s *image.Store, path string, opts image.LoadOptions) ([]*image.Image, error) {
	var imgs []*image.Image
	var err error
	switch {
	case path == "" || path == "-":
		if isTerminal(os.Stdin) {
			return nil, usageError{msg: "image load reads an archive from stdin (a pipe or a file) or -i FILE, not from a terminal"}
		}
		imgs, err = s.Load(ctx, os.Stdin, opts)
	default:
		st, serr := os.Stat(path)
		switch {
		case serr != nil:
			return nil, &sandbox.InvalidError{Reason: "image_archive", Msg: serr.Error()}
		case st.IsDir():
			imgs, err = s.LoadDir(ctx, path, opts)
		default:
			f, ferr := os.Open(path)
			if ferr != nil {
				return nil, &sandbox.InvalidError{Reason: "image_archive", Msg: ferr.Error()}
			}
			defer f.Close()
			imgs, err = s.Load(ctx, f, opts)
		}
	}
	if err != nil {
		return nil, wrap("load", cliBound(err))
	}
	return imgs, nil
}

// saveImages writes refs as one archive to path, or to stdout when path
// is "" or "-". A file is written beside path and renamed into place
// once whole, 0600 (an image may hold what its maker keeps private).
func saveImages(ctx context.Context, s *image.Store, path, format string, refs []string) error {
	if path == "" || path == "-" {
		if isTerminal(os.Stdout) {
			return usageError{msg: "image save writes an archive: give -o FILE or redirect stdout"}
		}
		return wrap("save", s.Save(ctx, os.Stdout, format, refs...))
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return &sandbox.InvalidError{Reason: "image_save", Msg: err.Error()}
	}
	tmp := f.Name()
	err = s.Save(ctx, f, format, refs...)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return wrap("save", err)
	}
	return nil
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

func imageJSON(img *image.Image) map[string]any {
	return map[string]any{"ref": img.Ref, "refs": img.Refs, "digest": img.Digest, "config_digest": img.ConfigDigest,
		"size": img.Size, "layers": img.Layers, "pulled_at": img.PulledAt, "config": img.Config}
}

// imageArgv pulls run's --image when given (see ensureImage) and, when
// run was given no command, returns the image's Entrypoint and Cmd.
func imageArgv(ctx context.Context, g *globals, ref string, argv []string) ([]string, error) {
	if ref == "" {
		return argv, nil
	}
	img, err := ensureImage(ctx, g, ref)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		argv = img.Config.Command(nil)
	}
	return argv, nil
}
