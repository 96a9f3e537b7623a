// Package contrib holds the files pinrt ships for the hosts it runs on:
// the systemd unit, crictl's and kubelet's configuration. The unit is
// embedded so that the e2e tests run under systemd (test/vm) start the
// daemon from the very file that ships, not from a copy of it.
package contrib

import _ "embed"

// SystemdUnit is pinrt.service.
//
//go:embed pinrt.service
var SystemdUnit string
