package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

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
	fake.PullAuths = nil
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
			wantAuth: &image.Auth{Username: "u", Password: "p", Auth: "dTpw", IdentityToken: "idt", RegistryToken: "rt"},
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
	s, _ := newImageServer(t, "reg/a:1")
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
		ID: idA, RepoTags: []string{"reg/a:1"}, RepoDigests: []string{"reg/a@sha256:d1"}, Size: 1000,
		ChainIDs: []string{"sha256:c1", "sha256:c2"}, Config: v1.Config{User: "1002", Cmd: []string{"sh"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("info = %+v, want %+v", got, want)
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
