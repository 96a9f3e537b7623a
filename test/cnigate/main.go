// Command cnigate is a chained CNI plugin for the e2e tests: ADD passes
// the previous result on; DEL, while the file named by the "gate" key of
// its configuration exists, creates "<gate>.entered" and waits (up to a
// minute) for the gate to go, so a test can kill the daemon in the middle
// of a pod's CNI DEL.
package main

import (
	"encoding/json"
	"io"
	"os"
	"time"
)

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		os.Exit(1)
	}
	var conf struct {
		CNIVersion string          `json:"cniVersion"`
		Gate       string          `json:"gate"`
		PrevResult json.RawMessage `json:"prevResult"`
	}
	if err := json.Unmarshal(in, &conf); err != nil && os.Getenv("CNI_COMMAND") != "VERSION" {
		os.Exit(1)
	}
	switch os.Getenv("CNI_COMMAND") {
	case "ADD":
		if len(conf.PrevResult) > 0 {
			_, _ = os.Stdout.Write(conf.PrevResult)
			return
		}
		_, _ = os.Stdout.Write([]byte(`{"cniVersion":"` + conf.CNIVersion + `"}`))
	case "DEL":
		if conf.Gate == "" {
			return
		}
		if _, err := os.Stat(conf.Gate); err != nil {
			return
		}
		_ = os.WriteFile(conf.Gate+".entered", nil, 0o644)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(conf.Gate); err != nil {
				return
			}
		}
	case "VERSION":
		_, _ = os.Stdout.Write([]byte(`{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}`))
	}
}
