package server

import (
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The Stream* RPCs return what their List counterparts return, in pages,
// so a node with thousands of containers never builds one response larger
// than kubelet's receive limit (16 MiB by default).

// streamPage is the most items a message holds, and streamPageBytes the
// most bytes. A count alone is no bound: a pod may carry 256 KiB of labels
// and annotations, and 100 such pods make 25 MiB.
const (
	streamPage      = 100
	streamPageBytes = 4 << 20
)

// sendPages sends items in pages of at most streamPage items and, unless
// one item alone is larger, streamPageBytes bytes as size measures them;
// nothing for no items.
func sendPages[T any](items []T, size func(T) int, send func([]T) error) error {
	for len(items) > 0 {
		n, bytes := 1, size(items[0])
		for n < len(items) && n < streamPage {
			b := size(items[n])
			if bytes+b > streamPageBytes {
				break
			}
			n, bytes = n+1, bytes+b
		}
		if err := send(items[:n]); err != nil {
			return err
		}
		items = items[n:]
	}
	return nil
}

// msgSize is a message's encoded size, for sendPages.
func msgSize[T proto.Message](m T) int { return proto.Size(m) }

// StreamPodSandboxes streams ListPodSandbox.
func (s *Server) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	resp, err := s.ListPodSandbox(stream.Context(), &runtimeapi.ListPodSandboxRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendPages(resp.Items, msgSize[*runtimeapi.PodSandbox], func(p []*runtimeapi.PodSandbox) error {
		return stream.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: p})
	})
}

// StreamContainers streams ListContainers.
func (s *Server) StreamContainers(req *runtimeapi.StreamContainersRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	resp, err := s.ListContainers(stream.Context(), &runtimeapi.ListContainersRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendPages(resp.Containers, msgSize[*runtimeapi.Container], func(p []*runtimeapi.Container) error {
		return stream.Send(&runtimeapi.StreamContainersResponse{Containers: p})
	})
}

// StreamContainerStats streams ListContainerStats.
func (s *Server) StreamContainerStats(req *runtimeapi.StreamContainerStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainerStatsResponse]) error {
	resp, err := s.ListContainerStats(stream.Context(), &runtimeapi.ListContainerStatsRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendPages(resp.Stats, msgSize[*runtimeapi.ContainerStats], func(p []*runtimeapi.ContainerStats) error {
		return stream.Send(&runtimeapi.StreamContainerStatsResponse{ContainerStats: p})
	})
}

// StreamPodSandboxStats streams ListPodSandboxStats.
func (s *Server) StreamPodSandboxStats(req *runtimeapi.StreamPodSandboxStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxStatsResponse]) error {
	resp, err := s.ListPodSandboxStats(stream.Context(), &runtimeapi.ListPodSandboxStatsRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendPages(resp.Stats, msgSize[*runtimeapi.PodSandboxStats], func(p []*runtimeapi.PodSandboxStats) error {
		return stream.Send(&runtimeapi.StreamPodSandboxStatsResponse{PodSandboxStats: p})
	})
}

// StreamPodSandboxMetrics streams ListPodSandboxMetrics.
func (s *Server) StreamPodSandboxMetrics(req *runtimeapi.StreamPodSandboxMetricsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxMetricsResponse]) error {
	resp, err := s.ListPodSandboxMetrics(stream.Context(), &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		return err
	}
	return sendPages(resp.PodMetrics, msgSize[*runtimeapi.PodSandboxMetrics], func(p []*runtimeapi.PodSandboxMetrics) error {
		return stream.Send(&runtimeapi.StreamPodSandboxMetricsResponse{PodSandboxMetrics: p})
	})
}

// StreamImages streams ListImages.
func (s *Server) StreamImages(req *runtimeapi.StreamImagesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamImagesResponse]) error {
	resp, err := s.ListImages(stream.Context(), &runtimeapi.ListImagesRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return sendPages(resp.Images, msgSize[*runtimeapi.Image], func(p []*runtimeapi.Image) error {
		return stream.Send(&runtimeapi.StreamImagesResponse{Images: p})
	})
}
