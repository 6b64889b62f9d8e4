// Package releases owns the nymph binaries the control plane publishes for
// over-the-air updates: storing them, listing them, and serving them to
// daemons with a sha256 sidecar.
//
// Two catalogues satisfy one interface, Catalogue: Store, one directory
// (a single control plane), and Bucket, a prefix of a blob store that
// control-plane replicas share (see Bucket for its layout, which has no
// index so that concurrent publishers never lose each other's releases).
//
// # Layout of a Store
//
// Under the store's directory (typically DataDir/releases):
//
//	.index.json                      the catalogue: version, triple, sha256, size, published time
//	.lock                            flock(2) target serialising writers across processes
//	<version>/nymph-<triple>         the binary, mode 0755
//	<version>/nymph-<triple>.sha256  "<hex>  nymph-<triple>\n", as sha256sum prints it
//
// Versions start with a letter or digit, so they never collide with the
// dot-files. Every file is written to a temporary name, fsynced and renamed,
// so a reader sees the old release or the new one, never a torn file.
// Re-publishing a version and triple replaces it the same way.
//
// # HTTP
//
// Handler serves GET/HEAD <prefix>/<version>/<triple> (the binary) and
// <prefix>/<version>/<triple>.sha256 (the sidecar); URLFor builds the first.
// The sidecar is what `lakeshore daemon update` reads when no --sha256 is
// given; FetchChecksum does that for a URL outside this store.
// Bucket.Handler serves the same paths from a bucket: the binary streamed
// through, or redirected to a presigned GET of the bucket itself.
package releases
