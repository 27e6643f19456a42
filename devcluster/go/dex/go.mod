// Dex, the test cluster's OIDC provider (devcluster/identity.py). github.com/dexidp/dex tags its
// releases v2.x while its module path has no /v2, so a release is reachable only as the
// pseudo-version of its commit (v2.45.1 here), and its go.mod replaces github.com/dexidp/dex/api/v2
// by a local directory, so `go install` cannot build it: this module requires the release at its
// pseudo-version and the published api/v2 module it was released with, and builds cmd/dex.
module tfk8s.dev/devcluster/dex

go 1.26.0

require (
	github.com/dexidp/dex v0.0.0-20260303133905-11d2eeb52b42
	github.com/dexidp/dex/api/v2 v2.4.0
)
