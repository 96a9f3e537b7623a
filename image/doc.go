// Package image pulls container images with go-containerregistry, keeps
// them in a small content store and mounts container root filesystems.
//
// On-disk layout under Options.Root:
//
//	blobs/sha256/<hex>     manifests, configs and compressed layers, by digest
//	layers/<chainid-hex>/  each layer unpacked once, keyed by its chain ID
//	index.json             the image records (written atomically)
//	idmapped/<pod-id>/     the layers directory idmapped once per userns pod
//	tmp/                   staging area; anything left there is garbage
//
// A layer only appears under layers/ once it has been fully unpacked and
// both its compressed digest and its diffID have been verified, because it
// is unpacked into tmp/ and renamed into place. An interrupted pull
// therefore never leaves a half layer that a later pull would trust.
// Layers of one pull download and unpack concurrently, but are renamed
// into place bottom-up: layers/<chain-id> names a whole chain, so it
// appears only after the layer below it did. A pull that fails takes
// back the layers and blobs it published, except those another running
// pull relies on: a pull pins its layers and blobs from before it looks
// for them until its image is recorded, and garbage collection skips what
// is pinned, so a removal never waits for a pull. A blob whose size or digest is not the manifest's
// fails the pull with errdefs.ErrDataLoss.
//
// A pull fails for want of progress (no byte from the registry for
// Options.PullProgressTimeout), not for taking long. Concurrent pulls of
// one reference with the same credentials share a download that runs
// detached from their contexts and stops when the last of them gives up.
//
// Container root filesystems are overlay mounts whose lower dirs are the
// image's layers. For a pod with a user namespace the whole layers
// directory is idmapped once per pod (open_tree + mount_setattr +
// move_mount) and the overlay takes its lower dirs from that one mapped
// tree, so no layer is ever chown-copied.
package image
