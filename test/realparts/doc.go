// Package realparts starts real external components for tests: an OpenSSH
// server, a single-node SLURM cluster, a PostgreSQL server, a local podman
// image, a gVisor sandbox check and moto (an AWS API emulator, for EC2).
//
// Every Start* function gives the calling test a private instance (its own
// temporary directory and its own random loopback ports) and registers a
// cleanup that kills every process the instance started, including the ones
// that daemonise or are forked by a job, so nothing outlives the test.
//
// A missing tool skips the test on a developer machine but fails it when
// CI=true, so that CI never silently loses coverage of a real backend.
// The components need root (sshd for root logins, slurmd, runuser for
// PostgreSQL, rootful podman and runsc), which is what CI runs as; see
// test/infra/install.sh for the Debian packages.
package realparts
