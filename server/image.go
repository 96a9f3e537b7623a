package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	crierrors "k8s.io/cri-api/pkg/errors"

	"github.com/pinrt/pinrt/image"
)

// PullImage pulls an image and returns its ID. The ID is the config
// digest, so kubelet gets the same ImageRef here, in ImageStatus and in
// ListImages, whichever tag or digest it pulled by.
func (s *Server) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref, err := imageRef(req.GetImage())
	if err != nil {
		return nil, err
	}
	start := time.Now()
	img, err := s.deps.Images.Pull(ctx, ref, toAuth(req.GetAuth()),
		image.ForNamespace(req.GetSandboxConfig().GetMetadata().GetNamespace()))
	s.observePull(start, img, err)
	if errors.Is(err, image.ErrSignatureRejected) {
		// kubelet recognises the refusal by this prefix of the message
		// (gRPC errors lose their chain), and reports the pod's image as
		// SignatureValidationFailed instead of ErrImagePull.
		return nil, fmt.Errorf("%w: %w", crierrors.ErrSignatureValidationFailed, err)
	}
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithField("image", ref).WithField("id", img.ID).Debug("pulled image over CRI")
	return &runtimeapi.PullImageResponse{ImageRef: img.ID}, nil
}

// ListImages lists the images, or only the one the filter's image
// reference resolves to (by ID, short ID, tag or digest, as ImageStatus).
func (s *Server) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	if ref := req.GetFilter().GetImage().GetImage(); ref != "" {
		img, err := s.deps.Images.Get(ref)
		if errdefs.IsNotFound(err) {
			return &runtimeapi.ListImagesResponse{}, nil
		}
		if err != nil {
			return nil, err
		}
		return &runtimeapi.ListImagesResponse{Images: []*runtimeapi.Image{s.toCRIImage(img)}}, nil
	}
	imgs := s.deps.Images.List()
	out := make([]*runtimeapi.Image, 0, len(imgs))
	for i := range imgs {
		out = append(out, s.toCRIImage(&imgs[i]))
	}
	return &runtimeapi.ListImagesResponse{Images: out}, nil
}

// ImageStatus reports one image. CRI wants an absent image reported as a
// response with a nil Image, not as an error: kubelet calls it to decide
// whether to pull.
func (s *Server) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	ref, err := imageRef(req.GetImage())
	if err != nil {
		return nil, err
	}
	img, err := s.deps.Images.Get(ref)
	if errdefs.IsNotFound(err) {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.ImageStatusResponse{Image: s.toCRIImage(img)}
	if req.GetVerbose() {
		if resp.Info, err = s.imageInfo(ctx, img, resp.Image.Pinned); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// RemoveImage removes an image with all its tags and digests, pinned or
// not: pinning keeps kubelet's GC away, an explicit removal wins. Like
// containerd, an image that is already gone is success: CRI requires the
// call to be idempotent, and kubelet's image GC may race a second
// removal.
func (s *Server) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	ref, err := imageRef(req.GetImage())
	if err != nil {
		return nil, err
	}
	if err := s.deps.Images.Remove(ctx, ref); err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ImageFsInfo reports the bytes and inodes used by the image store and,
// as the container filesystem, those of the writable layers under
// <root>/containers (the sum of their last background measurement, see
// stats.go).
func (s *Server) ImageFsInfo(ctx context.Context, req *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	bytes, inodes, err := s.deps.Images.FsUsage()
	if err != nil {
		return nil, fmt.Errorf("image filesystem usage: %w", err)
	}
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: s.deps.Images.Root()},
		UsedBytes:  &runtimeapi.UInt64Value{Value: bytes},
		InodesUsed: &runtimeapi.UInt64Value{Value: inodes},
	}}, ContainerFilesystems: []*runtimeapi.FilesystemUsage{s.containerFilesystem()}}, nil
}

// imageRef validates the reference of an ImageSpec.
func imageRef(spec *runtimeapi.ImageSpec) (string, error) {
	if spec.GetImage() == "" {
		return "", fmt.Errorf("image reference is empty: %w", errdefs.ErrInvalidArgument)
	}
	return spec.GetImage(), nil
}

// toAuth converts CRI credentials; nil and empty both mean anonymous.
func toAuth(a *runtimeapi.AuthConfig) *image.Auth {
	if a == nil {
		return nil
	}
	return &image.Auth{
		Username: a.Username, Password: a.Password, Auth: a.Auth,
		IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken, ServerAddress: a.ServerAddress,
	}
}

func (s *Server) toCRIImage(img *image.Image) *runtimeapi.Image {
	out := &runtimeapi.Image{
		Id: img.ID, RepoTags: img.RepoTags, RepoDigests: img.RepoDigests, Size: img.Size,
		Spec:   &runtimeapi.ImageSpec{Image: img.ID},
		Pinned: pinned(s.cfg.Image.PinnedImages, img),
	}
	// kubelet checks runAsNonRoot against these: a numeric USER goes in
	// Uid, a name in Username (it can't tell whether a name is root).
	uid, user := img.UIDOrUser()
	if uid != nil {
		out.Uid = &runtimeapi.Int64Value{Value: *uid}
	}
	out.Username = user
	return out
}

// pinned reports whether one of the image's names (ID, tags, digests)
// matches a pattern of image.pinned_images: exactly, or by prefix for a
// pattern ending in "*". An exact pattern may also be written short
// ("busybox:1.36"), as it normalises to a tag.
func pinned(patterns []string, img *image.Image) bool {
	names := make([]string, 0, 1+len(img.RepoTags)+len(img.RepoDigests))
	names = append(append(append(names, img.ID), img.RepoTags...), img.RepoDigests...)
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, prefix) }) {
				return true
			}
			continue
		}
		if slices.Contains(names, p) {
			return true
		}
		if n, err := image.NormalizeRef(p); err == nil && slices.Contains(names, n) {
			return true
		}
	}
	return false
}

// verboseImage is the "info" JSON of a verbose ImageStatus. chainID and
// imageSpec are what containerd reports (the top layer's chain ID and
// the whole OCI image config), so tools reading either runtime's output
// find them; the rest is pinrt's record of the image.
type verboseImage struct {
	ID          string         `json:"id"`
	RepoTags    []string       `json:"repoTags"`
	RepoDigests []string       `json:"repoDigests"`
	Size        uint64         `json:"size"`
	Pinned      bool           `json:"pinned"`
	ChainID     string         `json:"chainID,omitempty"`
	ChainIDs    []string       `json:"chainIDs"`
	Config      v1.Config      `json:"config"`
	ImageSpec   *v1.ConfigFile `json:"imageSpec,omitempty"`
}

// imageInfo builds the verbose info. A config blob that cannot be read
// leaves imageSpec out rather than failing the status kubelet relies on.
func (s *Server) imageInfo(ctx context.Context, img *image.Image, isPinned bool) (map[string]string, error) {
	v := verboseImage{
		ID: img.ID, RepoTags: img.RepoTags, RepoDigests: img.RepoDigests,
		Size: img.Size, Pinned: isPinned, ChainIDs: img.ChainIDs, Config: img.Config,
	}
	if n := len(img.ChainIDs); n > 0 {
		v.ChainID = img.ChainIDs[n-1]
	}
	cf, err := s.deps.Images.ConfigFile(img.ID)
	if err != nil {
		log.G(ctx).WithError(err).WithField("image", img.ID).Warn("verbose image status without the image config")
	} else {
		v.ImageSpec = cf
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("image %s info: %w: %w", img.ID, err, errdefs.ErrInternal)
	}
	return map[string]string{"info": string(b)}, nil
}
