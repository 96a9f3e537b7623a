// Package sigpolicy decides, before an image is fetched, whether the
// node's signature policy lets it run. The policy is a
// containers-policy.json(5) file, evaluated by the containers/image
// library (go.podman.io/image/v5/signature), as CRI-O does: pinrt writes
// neither policy evaluation nor signature crypto of its own.
//
// A verification fetches the manifest the reference names and the
// signatures stored beside it, through the containers/image docker
// transport configured like pinrt's own pulls (mirrors, skip_origin,
// plain HTTP for loopback and insecure registries, CA files,
// credentials), and returns the digest of the manifest it accepted. The
// image store then pulls that digest, so what runs is what was verified,
// whichever mirror served it.
//
// Signatures are looked up as registries hold them for sigstore: cosign's
// "sha256-<digest>.sig" attachments, read from the registry that served
// the manifest (use-sigstore-attachments in a registries.d of pinrt's
// own, under Config.StateDir). The identity checked is the name the image
// was asked for, not the mirror's.
//
// Policy files are read again when they change (size, mtime or inode), so
// an edit applies to the next pull. A policy that does not parse fails
// the pulls it governs; it never falls back to accepting everything.
//
// Importing this package needs the build tag containers_image_openpgp
// (the OpenPGP implementation in Go instead of gpgme through cgo); the
// Makefile sets it.
package sigpolicy
