package image

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

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
