package bench

import (
	"context"
	"errors"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CleanupStats says what Cleanup removed.
type CleanupStats struct {
	Containers int
	Sandboxes  int
}

// Cleanup removes containers and sandboxes, as `crictl rm -fa; crictl rmp
// -fa` would. With all set it removes everything on the endpoint; otherwise
// only objects labelled by this tool (and of runID, if non-empty). It goes
// on after a failure and returns all errors joined.
func Cleanup(ctx context.Context, c *Client, all bool, runID string) (CleanupStats, error) {
	var st CleanupStats
	labels := map[string]string{}
	if !all {
		if runID != "" {
			labels[LabelRun] = runID
		}
	}
	match := func(l map[string]string) bool {
		if all {
			return true
		}
		v, ok := l[LabelRun]
		return ok && (runID == "" || v == runID)
	}
	var errs []error
	call := func(what string, f func(ctx context.Context) error) bool {
		rctx, cancel := c.rpc(ctx)
		defer cancel()
		if err := f(rctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return false
		}
		return true
	}

	var ctrs []*runtimeapi.Container
	call("ListContainers", func(ctx context.Context) error {
		resp, err := c.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{
			Filter: &runtimeapi.ContainerFilter{LabelSelector: labels},
		})
		ctrs = resp.GetContainers()
		return err
	})
	for _, ct := range ctrs {
		if !match(ct.GetLabels()) {
			continue
		}
		id := ct.GetId()
		call("StopContainer "+id, func(ctx context.Context) error {
			_, err := c.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
			return err
		})
		if call("RemoveContainer "+id, func(ctx context.Context) error {
			_, err := c.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		}) {
			st.Containers++
		}
	}

	var pods []*runtimeapi.PodSandbox
	call("ListPodSandbox", func(ctx context.Context) error {
		resp, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{
			Filter: &runtimeapi.PodSandboxFilter{LabelSelector: labels},
		})
		pods = resp.GetItems()
		return err
	})
	for _, p := range pods {
		if !match(p.GetLabels()) {
			continue
		}
		id := p.GetId()
		call("StopPodSandbox "+id, func(ctx context.Context) error {
			_, err := c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
			return err
		})
		if call("RemovePodSandbox "+id, func(ctx context.Context) error {
			_, err := c.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
			return err
		}) {
			st.Sandboxes++
		}
	}
	return st, errors.Join(errs...)
}
