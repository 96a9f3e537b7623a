package sigpolicy

import "time"

// The daemon and pinrt-sigpolicy talk once per run of the helper: one
// HelperRequest as JSON on its stdin, one HelperResponse as JSON on its
// stdout, exit status 0. A policy's refusal or a registry that is down is
// an answer (HelperResponse.Error), not a failure of the helper: a
// non-zero exit, a signal or anything but one response on stdout means
// the helper itself broke, and its stderr says why.

// ProtocolVersion is the HelperRequest.Version this package sends. The
// helper refuses another, so a pinrt-sigpolicy left over from another
// release fails loudly instead of misreading a request.
const ProtocolVersion = 1

// The operations of a HelperRequest.
const (
	// OpCheck parses every file of HelperRequest.Policies.
	OpCheck = "check"
	// OpVerify checks HelperRequest.Ref against HelperRequest.Policy and
	// answers the digest of the manifest it accepted.
	OpVerify = "verify"
)

// HelperRequest is what the daemon writes to pinrt-sigpolicy's stdin.
type HelperRequest struct {
	Version int    `json:"version"`
	Op      string `json:"op"`
	// Deadline is when the daemon stops waiting: the helper gives up
	// then too, so one whose daemon died does not linger.
	Deadline time.Time `json:"deadline"`
	// Policies are the files OpCheck parses.
	Policies []string `json:"policies,omitempty"`
	// Policy is the containers-policy.json that governs OpVerify's Ref.
	Policy string `json:"policy,omitempty"`
	// Ref is a normalized reference ("host/repo:tag" or
	// "host/repo@sha256:...").
	Ref string `json:"ref,omitempty"`
	// Paths configure the library for OpVerify; every one is required,
	// so nothing of the host's /etc/containers or $HOME is read.
	Paths *HelperPaths `json:"paths,omitempty"`
	// Credentials are the pull's own; nil uses Paths.AuthFile.
	Credentials *HelperCredentials `json:"credentials,omitempty"`
}

// HelperPaths are the files and directories of the daemon's state
// directory that stand in for the library's system-wide configuration
// (the fields of go.podman.io/image/v5/types.SystemContext named alike).
type HelperPaths struct {
	RegistriesDir     string `json:"registries_dir"`      // RegistriesDirPath: registries.d
	RegistriesConf    string `json:"registries_conf"`     // SystemRegistriesConfPath
	RegistriesConfDir string `json:"registries_conf_dir"` // SystemRegistriesConfDirPath
	CertDir           string `json:"cert_dir"`            // DockerPerHostCertDirPath: certs.d
	AuthFile          string `json:"auth_file"`           // AuthFilePath
	SignaturePolicy   string `json:"signature_policy"`    // SignaturePolicyPath: never read, Policy is
}

// HelperCredentials are a pull's credentials, the CRI "auth" already
// decoded into Username and Password. RegistryToken, when set, is used
// alone.
type HelperCredentials struct {
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	IdentityToken string `json:"identity_token,omitempty"`
	RegistryToken string `json:"registry_token,omitempty"`
}

// HelperResponse is what pinrt-sigpolicy writes to its stdout: Digest
// for an accepted OpVerify, Error for any refusal or failure, neither
// for a successful OpCheck.
type HelperResponse struct {
	Digest string       `json:"digest,omitempty"`
	Error  *HelperError `json:"error,omitempty"`
}

// The kinds of a HelperError. The daemon maps each to its errdefs
// class; KindRejected becomes a *RejectedError.
const (
	KindRejected           = "rejected"
	KindInvalid            = "invalid"
	KindFailedPrecondition = "failed_precondition"
	KindUnavailable        = "unavailable"
	KindNotFound           = "not_found"
	KindDataLoss           = "data_loss"
	// KindUnauthenticated is a registry that refused the pull's
	// credentials (or their absence) while the signatures were read.
	KindUnauthenticated = "unauthenticated"
	// KindPermissionDenied is a registry that denied the pull (a
	// DENIED error, GHCR's and Harbor's 403) while the signatures were
	// read.
	KindPermissionDenied = "permission_denied"
	// KindResourceExhausted is a registry that limits the pull's rate
	// (429 TOOMANYREQUESTS, Docker Hub's pull limit) and still did after
	// the retries its Retry-After allowed.
	KindResourceExhausted = "resource_exhausted"
)

// HelperError is an answer other than acceptance.
type HelperError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Scope and Requirements name, for KindRejected, the policy section
	// that refused the image and the types of its requirements.
	Scope        string `json:"scope,omitempty"`
	Requirements string `json:"requirements,omitempty"`
}

func (e *HelperError) Error() string { return e.Message }
