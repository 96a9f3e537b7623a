// Package sigpolicy decides, before an image is fetched, whether the
// node's signature policy lets it run. The policy is a
// containers-policy.json(5) file, evaluated by the containers/image
// library (go.podman.io/image/v5/signature), as CRI-O does: pinrt writes
// neither policy evaluation nor signature crypto of its own.
//
// The library runs in a helper, pinrt-sigpolicy (cmd/pinrt-sigpolicy, a
// Go module of its own), not in the daemon: it and what it pulls in cost
// the daemon several MiB of memory on every node, most of which
// configures no policy, and its OpenPGP needs a build tag (or gpgme
// through cgo) that the daemon's build then no longer needs. This
// package is the daemon's side: it picks the policy that governs a pull,
// writes the library's configuration, and runs the helper once per
// verified pull (protocol.go has the exchange). No policy, no helper.
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
// Every run of the helper parses the policy file again, so an edit
// applies to the next pull. A policy that does not parse fails the pulls
// it governs; it never falls back to accepting everything.
package sigpolicy
