// Package image gives local sandboxes the software they run on: OCI
// images from any registry (Docker Hub, GHCR, a private one with the
// credentials of the usual docker config), pulled with
// go-containerregistry, verified by digest and unpacked once into a
// content-addressed cache under the state directory (Store), whose roots
// every sandbox of an image shares read-only.
//
//	s, err := image.Open(filepath.Join(stateDir, "images"))
//	img, err := s.Ensure(ctx, "debian:12", image.PullOptions{})
//	// img.Root is the unpacked root; img.Config its Env, WorkingDir,
//	// User, Entrypoint and Cmd.
//
// What is verified: every layer blob against its digest as it downloads
// (a mismatch is refused and the blob deleted: DigestError), each
// layer's uncompressed stream against the config's diff_id as it
// unpacks, and the manifest and config by the library. The manifest and
// config are kept as blobs beside the layers. A commit's config is its
// base's with the new layer's diff_id and a history entry added. What is refused
// while unpacking (LayerError, and no root is published): entry names
// with a ".." element, hard links to anything outside the root,
// whiteouts of nothing. Device nodes are skipped (Image.Skipped counts
// them). Every path is resolved by the kernel with openat2's
// RESOLVE_IN_ROOT against the root being unpacked, so a symlink an image
// plants, absolute or relative, in the same layer or an earlier one, is
// followed inside the root, never out of it. This is written here on the
// kernel's own primitive rather than with a library: go-containerregistry
// only flattens layers into one tar stream (mutate.Extract), and the
// unpackers that write to disk (moby's archive, containerd's) bring a
// container engine's dependencies with them.
//
// Whiteouts (".wh.name", ".wh..wh..opq") are applied while unpacking:
// the cache holds each image's merged tree, and a sandbox's own writes
// go into an upper layer of its own (overlayfs, in the mechanism).
// Concurrent pulls of one image, in one process or several sharing the
// directory, download each layer once (a lock per digest); a pull cut
// short leaves only a tmp/ entry that no sandbox can see and that Prune
// removes.
//
// Images come in without a registry too (Load, LoadDir): a docker save
// tarball (manifest.json, RepoTags; docker 25's, which is an OCI layout
// as well, included) or an OCI image layout, in a tar or a directory
// (index.json; its images named by io.containerd.image.name, or by
// org.opencontainers.image.ref.name when that is a full reference, or by
// LoadOptions.Ref); a multi-platform index gives this machine's image.
// go-containerregistry reads the formats (pkg/v1/tarball, pkg/v1/layout);
// each image is then verified and unpacked exactly as a pulled one, with
// the same bounds. An archive that is not a regular file (a pipe) is
// first copied into tmp/, within MaxBytes and 16 MiB. Save writes images
// out again, as an OCI layout tar (FormatOCI: the manifests, configs and
// layers byte for byte, so a loaded image has the digest it was saved
// with) or a docker save tarball (FormatDocker), from the manifest and
// config the store keeps of every image it pulls, loads or commits
// (V1Image). A plain-HTTP registry answers on loopback
// (localhost:5000/x, 127.0.0.1:PORT/x), as go-containerregistry decides
// for such hosts; any other is spoken to over HTTPS.
//
// Every image is bounded (PullOptions.MaxBytes and MaxEntries, by
// default DefaultMaxBytes and DefaultMaxEntries, managoat image pull
// --max-bytes and --max-entries): the bytes its layers download, checked
// against the manifest before any is fetched, the bytes of file content
// they unpack to, checked against each file's header before it is
// written, and the entries they hold, summed over the layers; past one,
// the image is refused (BoundError, invalid image_too_large, naming the
// bound) and nothing of it is published, its half-unpacked root removed.
// The layers' uncompressed streams may be only so much longer than the
// files they hold (4 KiB an entry and 16 MiB in all), so data after a
// tar's end costs no decompressor hours. A config over 16 MiB or a
// manifest of more than 1024 layers is refused the same way. A commit's
// new layer gets the default bounds. A layer whose descriptor names URLs
// (a foreign layer, which the library would fetch from the image's
// addresses) is refused before any layer is fetched.
//
// The store is private: Open makes its directory and every one inside it
// 0700 (and the directories above it it has to make, the state directory
// when an image command runs first), and makes a store an older managoat
// left open 0700 again. An unpacked root keeps its files' owners and
// set-id bits, which its sandboxes need and which the mechanisms mount
// nosuid; no other host user can walk to it.
//
// Errors are in the sandbox taxonomy: an unknown repository or tag is
// not_found naming the reference (NotFoundError), a registry's 401 or 403
// is denied, a malformed reference invalid.
package image
