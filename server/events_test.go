package server

import (
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestEventBusDropsSlowSubscriber(t *testing.T) {
	b := newEventBus()
	slow, fast := b.subscribe(), b.subscribe()
	for i := range subscriberBuffer + 1 {
		b.publish(&runtimeapi.ContainerEventResponse{ContainerId: "c", CreatedAt: int64(i)})
		// fast keeps up.
		if ev := <-fast.ch; ev.CreatedAt != int64(i) {
			t.Fatalf("fast got event %d, want %d", ev.CreatedAt, i)
		}
	}
	select {
	case <-slow.dropped:
	default:
		t.Fatal("a subscriber that fell a full buffer behind was not dropped")
	}
	if got := len(slow.ch); got != subscriberBuffer {
		t.Errorf("slow kept %d queued events, want %d", got, subscriberBuffer)
	}
	if !errdefs.IsResourceExhausted(slow.err) {
		t.Errorf("slow subscriber's error = %v, want ResourceExhausted", slow.err)
	}
	select {
	case <-fast.dropped:
		t.Fatal("the subscriber that kept up was dropped")
	default:
	}
	b.unsubscribe(slow) // dropped already: must not close twice
	b.close()
	select {
	case <-fast.dropped:
	default:
		t.Fatal("close left a subscriber open")
	}
	if fast.err != nil {
		t.Errorf("a subscriber ended by close has error %v, want a clean end", fast.err)
	}
	if late := b.subscribe(); late == nil {
		t.Fatal("subscribe after close returned nil")
	} else {
		select {
		case <-late.dropped:
		default:
			t.Fatal("a subscriber after close is not dropped at once")
		}
	}
}
