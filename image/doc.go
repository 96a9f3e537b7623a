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
//
// Container root filesystems are overlay mounts whose lower dirs are the
// image's layers. For a pod with a user namespace the whole layers
// directory is idmapped once per pod (open_tree + mount_setattr +
// move_mount) and the overlay takes its lower dirs from that one mapped
// tree, so no layer is ever chown-copied.
package image
