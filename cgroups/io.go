package cgroups

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// DeviceIO is a cgroup's block I/O on one device, since the cgroup was
// made.
type DeviceIO struct {
	Major, Minor uint32
	// Device is "/dev/<name>" of the device, or "major:minor" where
	// /sys does not name it.
	Device                string
	ReadBytes, WriteBytes uint64
	Reads, Writes         uint64
}

// parseBlkio adds a v1 blkio.throttle file to io: lines
// "major:minor Op value" with Op Read, Write, Sync, Async, Discard or
// Total, and a last "Total n" line. count says the file counts
// operations (io_serviced) rather than bytes.
func parseBlkio(b []byte, io []DeviceIO, count bool) ([]DeviceIO, error) {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		f := bytes.Fields(line)
		if len(f) != 3 {
			continue
		}
		var read bool
		switch string(f[1]) {
		case "Read":
			read = true
		case "Write":
		default:
			continue
		}
		maj, min, err := parseDevice(f[0])
		if err != nil {
			return nil, err
		}
		v, err := strconv.ParseUint(string(f[2]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", f[0], f[1], err)
		}
		d := deviceEntry(&io, maj, min)
		switch {
		case read && count:
			d.Reads = v
		case read:
			d.ReadBytes = v
		case count:
			d.Writes = v
		default:
			d.WriteBytes = v
		}
	}
	return io, nil
}

// parseIOStat parses v2's io.stat: a line per device,
// "major:minor rbytes=n wbytes=n rios=n wios=n dbytes=n dios=n".
func parseIOStat(b []byte) ([]DeviceIO, error) {
	var io []DeviceIO
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		f := bytes.Fields(line)
		if len(f) < 2 {
			continue
		}
		maj, min, err := parseDevice(f[0])
		if err != nil {
			return nil, err
		}
		d := deviceEntry(&io, maj, min)
		for _, kv := range f[1:] {
			k, v, ok := bytes.Cut(kv, []byte{'='})
			if !ok {
				continue
			}
			var dst *uint64
			switch string(k) {
			case "rbytes":
				dst = &d.ReadBytes
			case "wbytes":
				dst = &d.WriteBytes
			case "rios":
				dst = &d.Reads
			case "wios":
				dst = &d.Writes
			default:
				continue
			}
			if *dst, err = strconv.ParseUint(string(v), 10, 64); err != nil {
				return nil, fmt.Errorf("%s %s: %w", f[0], k, err)
			}
		}
	}
	return io, nil
}

func parseDevice(b []byte) (uint32, uint32, error) {
	ma, mi, ok := bytes.Cut(b, []byte{':'})
	maj, err1 := strconv.ParseUint(string(ma), 10, 32)
	min, err2 := strconv.ParseUint(string(mi), 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("device %q: want major:minor: %w", b, strconv.ErrSyntax)
	}
	return uint32(maj), uint32(min), nil
}

// deviceEntry returns the entry of maj:min in *io, appending it first if
// there is none. A cgroup does I/O on a handful of devices.
func deviceEntry(io *[]DeviceIO, maj, min uint32) *DeviceIO {
	for i := range *io {
		if (*io)[i].Major == maj && (*io)[i].Minor == min {
			return &(*io)[i]
		}
	}
	*io = append(*io, DeviceIO{Major: maj, Minor: min})
	return &(*io)[len(*io)-1]
}

// nameDevices fills in each entry's Device from the DEVNAME of
// /sys/dev/block/<major>:<minor>/uevent, read once per device and kept:
// a device number names the same disk while the machine runs.
func (r *Reader) nameDevices(io []DeviceIO) {
	for i := range io {
		d := &io[i]
		key := strconv.FormatUint(uint64(d.Major), 10) + ":" + strconv.FormatUint(uint64(d.Minor), 10)
		r.devMu.Lock()
		name, ok := r.devNames[key]
		r.devMu.Unlock()
		if !ok {
			name = key
			if b, err := os.ReadFile(r.sysBlock + "/" + key + "/uevent"); err == nil {
				for _, line := range bytes.Split(b, []byte{'\n'}) {
					if v, found := bytes.CutPrefix(line, []byte("DEVNAME=")); found && len(v) > 0 {
						name = "/dev/" + string(v)
					}
				}
			}
			r.devMu.Lock()
			r.devNames[key] = name
			r.devMu.Unlock()
		}
		d.Device = name
	}
}
