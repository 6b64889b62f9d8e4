// Command selfupdate is a stand-in for nymph in the ota tests: it prints its
// PID and stamped version, then updates itself through selfupdate.Updater and
// execs the new image unless it already is the target version.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"nymph/daemon/selfupdate"
	"nymph/messages"
)

var version = "dev"

func main() {
	fmt.Printf("pid=%d version=%s args=%s mark=%s\n", os.Getpid(), version, strings.Join(os.Args[1:], ","), os.Getenv("OTA_TEST_MARK"))
	target := os.Getenv("OTA_TARGET_VERSION")
	if version == target {
		return
	}
	u := selfupdate.New(zerolog.New(os.Stderr), selfupdate.Options{})
	cmd := messages.OtaUpdate{Version: target, URL: os.Getenv("OTA_URL"), SHA256: os.Getenv("OTA_SHA256")}
	if _, err := u.Install(context.Background(), cmd); err != nil {
		fmt.Printf("install failed: %v\n", err)
		os.Exit(2)
	}
	err := u.Exec()
	if errors.Is(err, selfupdate.ErrSelfExecDisabled) {
		fmt.Println("installed; self-exec disabled")
		return
	}
	fmt.Printf("exec failed: %v\n", err)
	os.Exit(3)
}
