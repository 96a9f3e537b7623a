package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	crierrors "k8s.io/cri-api/pkg/errors"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/image/imagetest"
)

// fakeImages completes imagetest.Fake (the ImageService side) with the
// rootfs half of Images, which no ImageService handler may touch.
type fakeImages struct {
	*imagetest.Fake
	root string
}

var _ Images = fakeImages{}

func (f fakeImages) Root() string { return f.root }
func (fakeImages) MountRootfs(context.Context, image.MountRequest) (string, error) {
	panic("ImageService handler mounted a rootfs")
}
func (fakeImages) MountImageVolume(context.Context, image.VolumeRequest) (string, error) {
	panic("ImageService handler mounted an image volume")
}
func (fakeImages) UnmountRootfs(context.Context, string, string, string) error {
	panic("ImageService handler unmounted a rootfs")
}
func (fakeImages) ReleasePod(context.Context, string) error {
	panic("ImageService handler released a pod")
}
func (fakeImages) Usage(string) (uint64, uint64, error) {
	panic("ImageService handler asked container usage")
}

const (
	idA = "sha256:aaaa000000000000000000000000000000000000000000000000000000000001"
	idB = "sha256:bbbb000000000000000000000000000000000000000000000000000000000002"
	idC = "sha256:cccc000000000000000000000000000000000000000000000000000000000003"
)

func testImages() map[string]image.Image {
	a := image.Image{
		ID: idA, RepoTags: []string{"reg/a:1"}, RepoDigests: []string{"reg/a@sha256:d1"}, Size: 1000,
		Config: v1.Config{User: "1002", Cmd: []string{"sh"}}, ChainIDs: []string{"sha256:c1", "sha256:c2"},
	}
	b := image.Image{
		ID: idB, RepoTags: []string{"reg/b:1"}, RepoDigests: []string{"reg/b@sha256:d2"}, Size: 2000,
		Config: v1.Config{User: "www-data:www-data"},
	}
	c := image.Image{ID: idC, RepoDigests: []string{"reg/c@sha256:d3"}, Size: 3}
	return map[string]image.Image{"reg/a:1": a, "reg/b:1": b, "reg/c@sha256:d3": c}
}

// newImageServer returns a server whose fake registry holds testImages
// and whose store already has the refs in pulled.
func newImageServer(t *testing.T, pulled ...string) (*Server, *imagetest.Fake) {
	t.Helper()
	fake := &imagetest.Fake{Registry: testImages(), Bytes: 4096, Inodes: 7}
	for _, ref := range pulled {
		if _, err := fake.Pull(context.Background(), ref, nil); err != nil {
			t.Fatal(err)
		}
	}
	fake.PullAuths, fake.PullNamespaces = nil, nil
	return New(conf.Default(), Deps{Images: fakeImages{Fake: fake, root: "/var/lib/pinrt-test/images"}}), fake
}

func spec(ref string) *runtimeapi.ImageSpec { return &runtimeapi.ImageSpec{Image: ref} }

func TestPullImage(t *testing.T) {
	tests := []struct {
		name     string
		ref      string
		auth     *runtimeapi.AuthConfig
		wantRef  string
		wantAuth *image.Auth
	}{
		{name: "tag, anonymous", ref: "reg/a:1", wantRef: idA},
		{name: "digest", ref: "reg/c@sha256:d3", wantRef: idC},
		{
			name: "every auth field passed through",
			ref:  "reg/b:1",
			auth: &runtimeapi.AuthConfig{
				Username: "u", Password: "p", Auth: "dTpw", ServerAddress: "reg",
				IdentityToken: "idt", RegistryToken: "rt",
			},
			wantRef:  idB,
			wantAuth: &image.Auth{Username: "u", Password: "p", Auth: "dTpw", IdentityToken: "idt", RegistryToken: "rt", ServerAddress: "reg"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, fake := newImageServer(t)
			resp, err := s.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: spec(tc.ref), Auth: tc.auth})
			if err != nil {
				t.Fatal(err)
			}
			if resp.ImageRef != tc.wantRef {
				t.Errorf("ImageRef = %q, want %q", resp.ImageRef, tc.wantRef)
			}
			if len(fake.PullAuths) != 1 || !reflect.DeepEqual(fake.PullAuths[0], tc.wantAuth) {
				t.Errorf("auths passed to Pull = %+v, want [%+v]", fake.PullAuths, tc.wantAuth)
			}
			// The same ID everywhere: status by the pulled ref reports it.
			st, err := s.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: spec(tc.ref)})
			if err != nil {
				t.Fatal(err)
			}
			if st.GetImage().GetId() != tc.wantRef {
				t.Errorf("ImageStatus(%q).Id = %q, want %q", tc.ref, st.GetImage().GetId(), tc.wantRef)
			}
		})
	}
}

// TestPullImageErrors runs through the interceptor so the test checks the
// code kubelet sees, not just the class.
func TestPullImageErrors(t *testing.T) {
	tests := []struct {
		name    string
		ref     string
		pullErr error
		want    codes.Code
	}{
		{"empty ref", "", nil, codes.InvalidArgument},
		{"unknown image", "reg/nope:1", nil, codes.NotFound},
		{"registry down", "reg/a:1", fmt.Errorf("pull reg/a:1: registry unreachable: %w", errdefs.ErrUnavailable), codes.Unavailable},
		{"bad credentials", "reg/a:1", fmt.Errorf("pull reg/a:1: 401: %w", errdefs.ErrUnauthenticated), codes.Unauthenticated},
		{"forbidden", "reg/a:1", fmt.Errorf("pull reg/a:1: 403: %w", errdefs.ErrPermissionDenied), codes.PermissionDenied},
		{"bad reference", "reg/a:1", fmt.Errorf("image reference: %w", errdefs.ErrInvalidArgument), codes.InvalidArgument},
		{"corrupt layer", "reg/a:1", fmt.Errorf("layer digest mismatch: %w", errdefs.ErrDataLoss), codes.DataLoss},
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/runtime.v1.ImageService/PullImage"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, fake := newImageServer(t)
			fake.PullErr = tc.pullErr
			resp, err := UnaryInterceptor(context.Background(), &runtimeapi.PullImageRequest{Image: spec(tc.ref)}, info,
				func(ctx context.Context, req any) (any, error) {
					return s.PullImage(ctx, req.(*runtimeapi.PullImageRequest))
				})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code = %v (err %v), want %v", got, err, tc.want)
			}
			if tc.pullErr != nil && status.Convert(err).Message() != tc.pullErr.Error() {
				t.Errorf("message = %q, want the store's %q", status.Convert(err).Message(), tc.pullErr.Error())
			}
			if resp != nil && !reflect.ValueOf(resp).IsNil() {
				t.Errorf("response = %v, want nil on error", resp)
			}
			if len(fake.Pulled) != 0 {
				t.Errorf("store holds %d images after a failed pull, want 0", len(fake.Pulled))
			}
		})
	}
}

// A refusal of the signature policy reaches kubelet as its
// SignatureValidationFailed: kubelet's CRI client strips an Unknown
// code's "rpc error" prefix and matches the message's start, since gRPC
// carries no error chain. The pull is for the sandbox's namespace.
func TestPullImageSignatureRejected(t *testing.T) {
	s, fake := newImageServer(t)
	fake.PullErr = fmt.Errorf("pull reg/a:1: image reg/a:1 is rejected by signature policy /p.json: %w", image.ErrSignatureRejected)
	info := &grpc.UnaryServerInfo{FullMethod: "/runtime.v1.ImageService/PullImage"}
	req := &runtimeapi.PullImageRequest{Image: spec("reg/a:1"), SandboxConfig: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "team-a", Uid: "u"},
	}}
	_, err := UnaryInterceptor(context.Background(), req, info, func(ctx context.Context, req any) (any, error) {
		return s.PullImage(ctx, req.(*runtimeapi.PullImageRequest))
	})
	st := status.Convert(err)
	if st.Code() != codes.Unknown || !strings.HasPrefix(st.Message(), crierrors.ErrSignatureValidationFailed.Error()+": ") ||
		!strings.Contains(st.Message(), "/p.json") {
		t.Fatalf("status = %v %q, want Unknown starting with %q", st.Code(), st.Message(), crierrors.ErrSignatureValidationFailed)
	}
	if !slices.Equal(fake.PullNamespaces, []string{"team-a"}) {
		t.Fatalf("pulled for namespaces %v, want [team-a]", fake.PullNamespaces)
	}
}

func TestImageStatus(t *testing.T) {
	uid := func(v int64) *runtimeapi.Int64Value { return &runtimeapi.Int64Value{Value: v} }
	tests := []struct {
		name string
		ref  string
		want *runtimeapi.Image
	}{
		{
			name: "numeric USER gives uid", ref: "reg/a:1",
			want: &runtimeapi.Image{
				Id: idA, RepoTags: []string{"reg/a:1"}, RepoDigests: []string{"reg/a@sha256:d1"}, Size: 1000,
				Uid: uid(1002), Spec: spec(idA),
			},
		},
		{
			name: "named USER gives username", ref: "reg/b:1",
			want: &runtimeapi.Image{
				Id: idB, RepoTags: []string{"reg/b:1"}, RepoDigests: []string{"reg/b@sha256:d2"}, Size: 2000,
				Username: "www-data", Spec: spec(idB),
			},
		},
		{
			name: "no USER, untagged, by digest", ref: "reg/c@sha256:d3",
			want: &runtimeapi.Image{Id: idC, RepoDigests: []string{"reg/c@sha256:d3"}, Size: 3, Spec: spec(idC)},
		},
		{name: "by full ID", ref: idB, want: &runtimeapi.Image{
			Id: idB, RepoTags: []string{"reg/b:1"}, RepoDigests: []string{"reg/b@sha256:d2"}, Size: 2000,
			Username: "www-data", Spec: spec(idB),
		}},
		{name: "unknown image is no image, no error", ref: "reg/nope:1", want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newImageServer(t, "reg/a:1", "reg/b:1", "reg/c@sha256:d3")
			resp, err := s.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: spec(tc.ref)})
			if err != nil {
				t.Fatal(err)
			}
			if !imagesEqual(resp.Image, tc.want) {
				t.Errorf("Image = %v, want %v", resp.Image, tc.want)
			}
			if resp.Info != nil {
				t.Errorf("Info = %v without verbose, want nil", resp.Info)
			}
		})
	}
}

func imagesEqual(a, b *runtimeapi.Image) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.String() == b.String()
}

func TestImageStatusVerbose(t *testing.T) {
	s, fake := newImageServer(t, "reg/a:1")
	s.cfg.Image.PinnedImages = []string{"reg/a*"}
	created := v1.Time{Time: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)}
	fake.Configs = map[string]*v1.ConfigFile{idA: {
		OS: "linux", Architecture: "arm64", Variant: "v8", Created: created,
		Config: v1.Config{
			User: "1002", Cmd: []string{"sh"}, Entrypoint: []string{"/init"},
			Env: []string{"PATH=/bin"}, Labels: map[string]string{"org.opencontainers.image.title": "a"},
		},
		History: []v1.History{{Created: created, CreatedBy: "ADD rootfs.tar /"}, {CreatedBy: "CMD [\"sh\"]", EmptyLayer: true}},
		RootFS:  v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{{Algorithm: "sha256", Hex: strings.Repeat("d1", 32)}}},
	}}
	resp, err := s.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: spec("reg/a:1"), Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := resp.Info["info"]
	if !ok || len(resp.Info) != 1 {
		t.Fatalf("Info = %v, want exactly an \"info\" key", resp.Info)
	}
	var got verboseImage
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatalf("info is not JSON: %v\n%s", err, raw)
	}
	want := verboseImage{
		ID: idA, RepoTags: []string{"reg/a:1"}, RepoDigests: []string{"reg/a@sha256:d1"}, Size: 1000, Pinned: true,
		ChainID: "sha256:c2", ChainIDs: []string{"sha256:c1", "sha256:c2"}, Config: v1.Config{User: "1002", Cmd: []string{"sh"}},
		ImageSpec: fake.Configs[idA],
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("info = %+v, want %+v", got, want)
	}
	// The keys containerd's ImageStatus has, as crictl inspecti shows them.
	var generic map[string]any
	if err := json.Unmarshal([]byte(raw), &generic); err != nil {
		t.Fatal(err)
	}
	spec, _ := generic["imageSpec"].(map[string]any)
	cfg, _ := spec["config"].(map[string]any)
	if generic["chainID"] != "sha256:c2" || spec["os"] != "linux" || spec["architecture"] != "arm64" ||
		cfg["User"] != "1002" || cfg["Entrypoint"] == nil || cfg["Labels"] == nil || spec["history"] == nil || spec["rootfs"] == nil {
		t.Errorf("info lacks containerd's keys:\n%s", raw)
	}
}

// A store that cannot read the config still answers the verbose status.
func TestImageStatusVerboseWithoutConfig(t *testing.T) {
	s, fake := newImageServer(t, "reg/b:1")
	fake.ConfigErr = fmt.Errorf("blob gone: %w", errdefs.ErrDataLoss)
	resp, err := s.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: spec("reg/b:1"), Verbose: true})
	if err != nil {
		t.Fatalf("ImageStatus: %v, want the status without imageSpec", err)
	}
	var got verboseImage
	if err := json.Unmarshal([]byte(resp.Info["info"]), &got); err != nil || got.ID != idB || got.ImageSpec != nil {
		t.Errorf("info = %+v (%v), want %s without imageSpec", got, err, idB)
	}
}

func TestImagePinned(t *testing.T) {
	tests := []struct {
		name     string
		patterns []string
		want     map[string]bool // by image ID
	}{
		{"none", nil, map[string]bool{idA: false, idB: false, idC: false}},
		{"exact tag", []string{"reg/a:1"}, map[string]bool{idA: true, idB: false, idC: false}},
		{"exact digest", []string{"reg/c@sha256:d3"}, map[string]bool{idA: false, idB: false, idC: true}},
		{"exact ID", []string{idB}, map[string]bool{idA: false, idB: true, idC: false}},
		{"tag is not a prefix", []string{"reg/a"}, map[string]bool{idA: false, idB: false, idC: false}},
		{"prefix", []string{"reg/b*"}, map[string]bool{idA: false, idB: true, idC: false}},
		{"prefix of everything", []string{"reg/*"}, map[string]bool{idA: true, idB: true, idC: true}},
		{"several", []string{"nothing:1", "reg/c*", "reg/a:1"}, map[string]bool{idA: true, idB: false, idC: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newImageServer(t, "reg/a:1", "reg/b:1", "reg/c@sha256:d3")
			s.cfg.Image.PinnedImages = tc.patterns
			list, err := s.ListImages(context.Background(), &runtimeapi.ListImagesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, img := range list.Images {
				got[img.Id] = img.Pinned
				st, err := s.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: spec(img.Id)})
				if err != nil || st.Image.Pinned != img.Pinned {
					t.Errorf("ImageStatus(%s).Pinned = %v (%v), ListImages says %v", img.Id, st.GetImage().GetPinned(), err, img.Pinned)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("pinned = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestImagePinnedShortName(t *testing.T) {
	img := &image.Image{ID: idA, RepoTags: []string{"docker.io/library/busybox:1.36"}}
	if !pinned([]string{"busybox:1.36"}, img) {
		t.Error("busybox:1.36 does not pin docker.io/library/busybox:1.36")
	}
	if pinned([]string{"busybox:1.37", "UPPER:x"}, img) {
		t.Error("another tag or a malformed name pins the image")
	}
}

// Pinning keeps kubelet's GC away; an explicit RemoveImage still removes.
func TestRemovePinnedImage(t *testing.T) {
	s, fake := newImageServer(t, "reg/a:1")
	s.cfg.Image.PinnedImages = []string{"reg/a:1"}
	if _, err := s.RemoveImage(context.Background(), &runtimeapi.RemoveImageRequest{Image: spec("reg/a:1")}); err != nil {
		t.Fatalf("RemoveImage(pinned) = %v", err)
	}
	if _, err := fake.Get(idA); !errdefs.IsNotFound(err) {
		t.Errorf("pinned image still there after RemoveImage: %v", err)
	}
}

func TestImageStatusEmptyRef(t *testing.T) {
	s, _ := newImageServer(t)
	for _, req := range []*runtimeapi.ImageStatusRequest{{}, {Image: spec("")}} {
		if _, err := s.ImageStatus(context.Background(), req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ImageStatus(%v) err = %v, want InvalidArgument", req, err)
		}
	}
}

func TestListImages(t *testing.T) {
	tests := []struct {
		name   string
		filter *runtimeapi.ImageFilter
		want   []string
	}{
		{"no filter lists all, by ID", nil, []string{idA, idB, idC}},
		{"empty filter lists all", &runtimeapi.ImageFilter{}, []string{idA, idB, idC}},
		{"empty image in filter lists all", &runtimeapi.ImageFilter{Image: spec("")}, []string{idA, idB, idC}},
		{"by tag", &runtimeapi.ImageFilter{Image: spec("reg/b:1")}, []string{idB}},
		{"by digest", &runtimeapi.ImageFilter{Image: spec("reg/a@sha256:d1")}, []string{idA}},
		{"by ID", &runtimeapi.ImageFilter{Image: spec(idC)}, []string{idC}},
		{"by short ID", &runtimeapi.ImageFilter{Image: spec("bbbb")}, []string{idB}},
		{"unknown", &runtimeapi.ImageFilter{Image: spec("reg/nope:1")}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newImageServer(t, "reg/a:1", "reg/b:1", "reg/c@sha256:d3")
			resp, err := s.ListImages(context.Background(), &runtimeapi.ListImagesRequest{Filter: tc.filter})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, img := range resp.Images {
				got = append(got, img.Id)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("IDs = %v, want %v", got, tc.want)
			}
		})
	}
	// Listed images carry the same conversion as ImageStatus.
	s, _ := newImageServer(t, "reg/a:1")
	resp, err := s.ListImages(context.Background(), &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Images) != 1 || resp.Images[0].GetUid().GetValue() != 1002 || resp.Images[0].Size != 1000 {
		t.Errorf("ListImages = %v, want one image with uid 1002 and size 1000", resp.Images)
	}
}

func TestRemoveImage(t *testing.T) {
	tests := []struct {
		name      string
		ref       string
		removeErr error
		wantErr   error
		wantLeft  []string
	}{
		{name: "by tag", ref: "reg/a:1", wantLeft: []string{idB}},
		{name: "by ID", ref: idB, wantLeft: []string{idA}},
		{name: "by digest", ref: "reg/a@sha256:d1", wantLeft: []string{idB}},
		{name: "unknown is success", ref: "reg/nope:1", wantLeft: []string{idA, idB}},
		{name: "empty ref", ref: "", wantErr: errdefs.ErrInvalidArgument, wantLeft: []string{idA, idB}},
		{
			name: "store failure surfaces", ref: "reg/a:1", removeErr: fmt.Errorf("gc: %w", errdefs.ErrInternal),
			wantErr: errdefs.ErrInternal, wantLeft: []string{idA, idB},
		},
		{
			name: "not found from a racing removal is success", ref: "reg/a:1",
			removeErr: fmt.Errorf("image: %w", errdefs.ErrNotFound), wantLeft: []string{idA, idB},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, fake := newImageServer(t, "reg/a:1", "reg/b:1")
			fake.RemoveErr = tc.removeErr
			_, err := s.RemoveImage(context.Background(), &runtimeapi.RemoveImageRequest{Image: spec(tc.ref)})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			var left []string
			for _, img := range fake.List() {
				left = append(left, img.ID)
			}
			if !reflect.DeepEqual(left, tc.wantLeft) {
				t.Errorf("images left = %v, want %v", left, tc.wantLeft)
			}
		})
	}
}

func TestImageFsInfo(t *testing.T) {
	s, fake := newImageServer(t)
	before := time.Now().UnixNano()
	resp, err := s.ImageFsInfo(context.Background(), &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ImageFilesystems) != 1 {
		t.Fatalf("ImageFilesystems = %v, want one", resp.ImageFilesystems)
	}
	fs := resp.ImageFilesystems[0]
	if fs.GetFsId().GetMountpoint() != "/var/lib/pinrt-test/images" || fs.GetUsedBytes().GetValue() != 4096 || fs.GetInodesUsed().GetValue() != 7 {
		t.Errorf("filesystem = %v, want mountpoint /var/lib/pinrt-test/images, 4096 bytes, 7 inodes", fs)
	}
	if fs.Timestamp < before || fs.Timestamp > time.Now().UnixNano() {
		t.Errorf("timestamp %d is not the time of the call", fs.Timestamp)
	}

	fake.FsUsageErr = fmt.Errorf("walk: %w", errdefs.ErrUnavailable)
	if _, err := s.ImageFsInfo(context.Background(), &runtimeapi.ImageFsInfoRequest{}); !errdefs.IsUnavailable(err) {
		t.Errorf("err = %v, want the store's Unavailable", err)
	}
}
