package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/pinrt/pinrt/test/testimage"
)

// BenchmarkUnpack unpacks a 100 MB image of 10 gzip layers (random, so
// incompressible data: 10 files of 1 MiB plus 100 small files each).
func BenchmarkUnpack(b *testing.B) {
	requireRoot(b)
	rng := rand.New(rand.NewPCG(1, 2))
	type layer struct {
		blob           []byte
		digest, diffID string
	}
	var layers []layer
	total := 0
	for l := range 10 {
		var files []testimage.File
		files = append(files, testimage.File{Path: fmt.Sprintf("l%d/", l)})
		for f := range 10 {
			data := make([]byte, 1<<20)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			total += len(data)
			files = append(files, testimage.File{Path: fmt.Sprintf("l%d/big%d", l, f), Content: data, UID: 1000, GID: 1000})
		}
		for f := range 100 {
			files = append(files, testimage.File{Path: fmt.Sprintf("l%d/d%d/small", l, f), Content: []byte("small file")})
		}
		blob, d, diff := gzLayer(b, files)
		layers = append(layers, layer{blob, d, diff})
	}
	base := b.TempDir()
	b.SetBytes(int64(total))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j, l := range layers {
			dir := filepath.Join(base, fmt.Sprintf("%d-%d", i, j))
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			if _, err := UnpackLayer(bytes.NewReader(l.blob), dir, l.digest, l.diffID); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		ents, _ := os.ReadDir(base)
		for _, e := range ents {
			os.RemoveAll(filepath.Join(base, e.Name()))
		}
		b.StartTimer()
	}
}

// BenchmarkMountUsernsRootfs measures MountRootfs for the first container
// of the 1st and of the 50th userns pod sharing one image; each pod gets
// its own idmapped tree.
func BenchmarkMountUsernsRootfs(b *testing.B) {
	requireRoot(b)
	s := newTestStore(b, Options{})
	img := pullTestImage(b, s)
	userns := pinUserns(b, 400000)
	ctx := context.Background()
	var first, fiftieth time.Duration
	for b.Loop() {
		dirs := make([]string, 50)
		for p := range 50 {
			dirs[p] = b.TempDir()
			start := time.Now()
			_, err := s.MountRootfs(ctx, MountRequest{
				ContainerID: "c", PodID: fmt.Sprintf("pod%d", p), ImageID: img.ID, Dir: dirs[p],
				UsernsPath: userns, RootUID: 400000, RootGID: 400000,
			})
			took := time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			switch p {
			case 0:
				first += took
			case 49:
				fiftieth += took
			}
		}
		b.StopTimer()
		for p, d := range dirs {
			if err := s.UnmountRootfs(ctx, "c", fmt.Sprintf("pod%d", p), d); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(first.Microseconds())/float64(b.N), "µs/pod1-mount")
	b.ReportMetric(float64(fiftieth.Microseconds())/float64(b.N), "µs/pod50-mount")
}

// BenchmarkColdPull pulls a 10-layer, 200 MB image (random, so
// incompressible: the bytes on the wire are the bytes on disk) from an
// in-process registry into an empty store, with the default
// max_concurrent_downloads. MB/s is of the compressed image; download
// and unpack are the time blocked reading from the registry and the rest
// of staging and publishing the layers, each summed over the concurrent
// layers (so together they exceed the wall time when layers overlap).
func BenchmarkColdPull(b *testing.B) {
	requireRoot(b)
	const (
		layers      = 10
		filesPerLay = 4
		fileSize    = 5 << 20
	)
	rng := rand.New(rand.NewPCG(3, 4))
	reg := startTestRegistry(b)
	var (
		ls    []v1.Layer
		total int64
	)
	for l := range layers {
		files := []testimage.File{{Path: fmt.Sprintf("l%d/", l)}}
		for f := range filesPerLay {
			data := make([]byte, fileSize)
			for i := 0; i < len(data); i += 8 {
				binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
			}
			files = append(files, testimage.File{Path: fmt.Sprintf("l%d/f%d", l, f), Content: data})
		}
		layer := makeLayer(b, files, gzipped, types.OCILayer)
		total += int64(len(layer.blob))
		ls = append(ls, layer)
	}
	reg.push(b, "cold:1", imageOf(b, types.OCIManifestSchema1, types.OCIConfigJSON, ls...))
	reg.pulls(nil)
	ref, err := parseRef(reg.ref("cold:1"))
	if err != nil {
		b.Fatal(err)
	}
	base := b.TempDir()
	ctx := context.Background()
	var netWait, unpack time.Duration
	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		s := newTestStore(b, Options{Root: filepath.Join(base, fmt.Sprint(i))})
		b.StartTimer()
		_, st, err := s.pull(ctx, ref, nil, PullRequest{})
		if err != nil {
			b.Fatal(err)
		}
		netWait += st.NetWait
		unpack += st.Unpack
		b.StopTimer()
		if err := os.RemoveAll(s.Root()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(netWait.Seconds()/float64(b.N), "download-s/op")
	b.ReportMetric(unpack.Seconds()/float64(b.N), "unpack-s/op")
}
