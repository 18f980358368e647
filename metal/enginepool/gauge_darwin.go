package enginepool

// The darwin gauge calls the kernel and Metal without cgo, so the agent stays
// CGO_ENABLED=0 and cross-compiles from Linux. Plain sysctls go through
// golang.org/x/sys/unix; Mach and libproc calls, the Metal device and the IORegistry go
// through github.com/ebitengine/purego, which binds C functions of system dylibs at run
// time. The C structs those calls fill are mirrored in metal/enginepool/internal/machstat, whose
// tests pin every offset against the SDK headers.
//
// None of this can run on the Linux machines the project is built on: keep it
// straightforward, and check every call's result rather than trusting a zero.

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"

	"github.com/ebitengine/purego"
	"github.com/ebitengine/purego/objc"
	"golang.org/x/sys/unix"

	"github.com/macfleet/macfleet/metal/enginepool/internal/machstat"
)

const (
	libSystemPath      = "/usr/lib/libSystem.B.dylib"
	libObjCPath        = "/usr/lib/libobjc.A.dylib"
	metalPath          = "/System/Library/Frameworks/Metal.framework/Metal"
	coreGraphicsPath   = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
	ioKitPath          = "/System/Library/Frameworks/IOKit.framework/IOKit"
	coreFoundationPath = "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation"

	kernSuccess = 0 // KERN_SUCCESS

	// CoreFoundation constants (<CoreFoundation/CFString.h>, <CFNumber.h>).
	kCFStringEncodingUTF8 = 0x08000100
	kCFNumberSInt64Type   = 4
)

// NewGauge returns the gauge of this operating system: on macOS a DarwinGauge.
func NewGauge() (Gauge, error) {
	return NewDarwinGauge()
}

// DarwinGauge measures memory on macOS: hw.memsize, the Metal recommended working set
// and iogpu.wired_limit_mb for the hardware; host_statistics64 for the host;
// proc_pid_rusage phys_footprint for a process (the figure Activity Monitor shows,
// which includes the Metal buffers a runner holds in unified memory).
type DarwinGauge struct {
	// host is mach_host_self(), taken once: every call adds a send right to the port.
	host     uint32
	pageSize uint64

	// host_statistics64(host_t, host_flavor_t, host_info64_t, mach_msg_type_number_t *)
	hostStatistics64 func(host uint32, flavor int32, info *machstat.VMStatistics64, count *uint32) int32
	// proc_pid_rusage(int pid, int flavor, rusage_info_t *buffer)
	procPidRusage func(pid int32, flavor int32, info *machstat.RusageInfoV4) int32

	// The Metal device and the GPU core count do not change while the machine runs.
	deviceOnce sync.Once
	device     deviceInfo
}

var _ Gauge = (*DarwinGauge)(nil)

// deviceInfo is what the Metal device and the IORegistry told us, once.
type deviceInfo struct {
	workingSet uint64 // MTLDevice.recommendedMaxWorkingSetSize; 0 when not queried
	name       string // MTLDevice.name, e.g. "Apple M2 Max"
	gpuCores   int    // AGXAccelerator gpu-core-count; 0 when unknown
}

// NewDarwinGauge binds the libSystem functions the gauge calls.
func NewDarwinGauge() (*DarwinGauge, error) {
	lib, err := purego.Dlopen(libSystemPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, &GaugeError{Op: "init", Source: libSystemPath, Err: err}
	}
	g := &DarwinGauge{}
	var machHostSelf func() uint32
	// host_page_size(host_t, vm_size_t *): vm_size_t is 64 bits on 64-bit macOS.
	var hostPageSize func(host uint32, size *uint64) int32
	for name, fn := range map[string]any{
		"mach_host_self":    &machHostSelf,
		"host_page_size":    &hostPageSize,
		"host_statistics64": &g.hostStatistics64,
		"proc_pid_rusage":   &g.procPidRusage,
	} {
		if err := bindFunc(lib, name, fn); err != nil {
			return nil, &GaugeError{Op: "init", Source: libSystemPath, Err: err}
		}
	}
	g.host = machHostSelf()
	if kr := hostPageSize(g.host, &g.pageSize); kr != kernSuccess || g.pageSize == 0 {
		// The VM counters are in kernel pages; hw.pagesize is the same on Apple Silicon.
		raw, err := unix.SysctlRaw("hw.pagesize")
		if err != nil {
			return nil, &GaugeError{Op: "init", Source: "host_page_size", Err: fmt.Errorf("kern_return %d, hw.pagesize: %w", kr, err)}
		}
		if g.pageSize, err = machstat.DecodeSysctlUint(raw); err != nil || g.pageSize == 0 {
			return nil, &GaugeError{Op: "init", Source: "hw.pagesize", Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
		}
	}
	return g, nil
}

// bindFunc points fptr (a pointer to a func variable) at the C function name in lib.
// Unlike purego.RegisterLibFunc it returns an error instead of panicking when the
// symbol is missing.
func bindFunc(lib uintptr, name string, fptr any) error {
	sym, err := purego.Dlsym(lib, name)
	if err != nil {
		return fmt.Errorf("binding %s: %w", name, err)
	}
	purego.RegisterFunc(fptr, sym)
	return nil
}

// Hardware reports hw.memsize, the chip (machdep.cpu.brand_string, e.g. "Apple M2
// Max"), physical CPU cores, GPU cores from the IORegistry, the Metal recommended
// working set and iogpu.wired_limit_mb. When the Metal device cannot be created (no
// GPU access, e.g. a sandbox or an ssh session without a window server) the working
// set is machstat.MetalWorkingSetEstimate of the memory size instead.
func (g *DarwinGauge) Hardware() (Hardware, error) {
	total, err := sysctlUint("hw.memsize")
	if err != nil {
		return Hardware{}, &GaugeError{Op: "hardware", Source: "hw.memsize", Err: err}
	}
	hw := Hardware{TotalBytes: int64(total)}
	hw.Chip, _ = unix.Sysctl("machdep.cpu.brand_string")

	// hw.physicalcpu counts performance and efficiency cores alike; the perflevel
	// sysctls (P = perflevel0, E = perflevel1) are the fallback.
	if n, err := sysctlUint("hw.physicalcpu"); err == nil {
		hw.CPUCores = int(n)
	} else {
		for _, name := range []string{"hw.perflevel0.physicalcpu", "hw.perflevel1.physicalcpu"} {
			if n, err := sysctlUint(name); err == nil {
				hw.CPUCores += int(n)
			}
		}
	}

	// iogpu.wired_limit_mb (macOS 14+) is in MiB, 0 meaning "the default"; macOS 13
	// had debug.iogpu.wired_limit in bytes.
	if mb, err := sysctlUint("iogpu.wired_limit_mb"); err == nil && mb > 0 {
		hw.WiredLimitBytes = int64(mb) << 20
	} else if b, err := sysctlUint("debug.iogpu.wired_limit"); err == nil && b > 0 {
		hw.WiredLimitBytes = int64(b)
	}

	g.deviceOnce.Do(func() { g.device = queryDevice() })
	hw.GPUCores = g.device.gpuCores
	if g.device.workingSet > 0 {
		hw.MetalWorkingSetBytes = int64(g.device.workingSet)
	} else {
		hw.MetalWorkingSetBytes = int64(machstat.MetalWorkingSetEstimate(total))
	}
	if hw.Chip == "" {
		hw.Chip = g.device.name
	}
	return hw, nil
}

// Host samples host_statistics64(HOST_VM_INFO64); see machstat.HostMemory for what
// counts as used.
func (g *DarwinGauge) Host() (HostMemory, error) {
	total, err := sysctlUint("hw.memsize")
	if err != nil {
		return HostMemory{}, &GaugeError{Op: "host", Source: "hw.memsize", Err: err}
	}
	var vm machstat.VMStatistics64
	count := uint32(machstat.HostVMInfo64Count)
	if kr := g.hostStatistics64(g.host, machstat.HostVMInfo64, &vm, &count); kr != kernSuccess {
		return HostMemory{}, &GaugeError{Op: "host", Source: "host_statistics64", Err: fmt.Errorf("kern_return %d", kr)}
	}
	if count != machstat.HostVMInfo64Count {
		// The kernel filled an older, shorter revision of the struct.
		return HostMemory{}, &GaugeError{Op: "host", Source: "host_statistics64", Err: fmt.Errorf("%w: %d of %d words", ErrMalformed, count, machstat.HostVMInfo64Count)}
	}
	used, avail := machstat.HostMemory(total, g.pageSize, vm)
	return HostMemory{TotalBytes: int64(total), UsedBytes: int64(used), AvailableBytes: int64(avail)}, nil
}

// Process returns ri_phys_footprint of proc_pid_rusage(pid, RUSAGE_INFO_V4).
func (g *DarwinGauge) Process(pid int) (int64, error) {
	if pid <= 0 {
		return 0, &GaugeError{Op: "process", Source: "proc_pid_rusage", Err: fmt.Errorf("invalid pid %d", pid)}
	}
	var ri machstat.RusageInfoV4
	if rc := g.procPidRusage(int32(pid), machstat.RusageInfoV4Flavor, &ri); rc != 0 {
		// purego does not surface errno; ask the kernel whether the process exists.
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return 0, &GaugeError{Op: "process", Source: "proc_pid_rusage", Err: fmt.Errorf("pid %d: %w", pid, ErrProcessNotFound)}
		}
		return 0, &GaugeError{Op: "process", Source: "proc_pid_rusage", Err: fmt.Errorf("pid %d: returned %d", pid, rc)}
	}
	return int64(ri.PhysFootprint), nil
}

// sysctlUint reads a numeric sysctl of either width.
func sysctlUint(name string) (uint64, error) {
	raw, err := unix.SysctlRaw(name)
	if err != nil {
		return 0, err
	}
	return machstat.DecodeSysctlUint(raw)
}

// queryDevice asks Metal and the IORegistry about the GPU. Failures leave zeros: the
// caller falls back to an estimate, and GPU cores are informational.
func queryDevice() deviceInfo {
	var d deviceInfo
	d.workingSet, d.name, _ = metalDevice()
	d.gpuCores, _ = gpuCoreCount()
	return d
}

// metalDevice creates the system default MTLDevice and reads its
// recommendedMaxWorkingSetSize and name, in Objective-C:
//
//	@autoreleasepool {
//	    id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
//	    size = dev.recommendedMaxWorkingSetSize; name = dev.name.UTF8String;
//	    [dev release];
//	}
func metalDevice() (workingSet uint64, name string, err error) {
	// Autorelease pools belong to a thread: stay on one for push … pop.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	// Apple's MTLCreateSystemDefaultDevice documentation: a command-line tool must
	// link CoreGraphics for the system to provide a default device. Loading it is
	// the run-time equivalent of linking it.
	if _, err := purego.Dlopen(coreGraphicsPath, purego.RTLD_NOW|purego.RTLD_GLOBAL); err != nil {
		return 0, "", fmt.Errorf("loading CoreGraphics: %w", err)
	}
	mtl, err := purego.Dlopen(metalPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return 0, "", fmt.Errorf("loading Metal: %w", err)
	}
	libobjc, err := purego.Dlopen(libObjCPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return 0, "", fmt.Errorf("loading libobjc: %w", err)
	}
	var (
		createDevice func() objc.ID
		poolPush     func() uintptr
		poolPop      func(pool uintptr)
	)
	if err := bindFunc(mtl, "MTLCreateSystemDefaultDevice", &createDevice); err != nil {
		return 0, "", err
	}
	if err := bindFunc(libobjc, "objc_autoreleasePoolPush", &poolPush); err != nil {
		return 0, "", err
	}
	if err := bindFunc(libobjc, "objc_autoreleasePoolPop", &poolPop); err != nil {
		return 0, "", err
	}

	pool := poolPush()
	defer poolPop(pool)

	// MTLCreateSystemDefaultDevice returns a retained object (+1): release it below.
	dev := createDevice()
	if dev == 0 {
		return 0, "", errors.New("MTLCreateSystemDefaultDevice returned nil")
	}
	defer dev.Send(objc.RegisterName("release"))

	// - (uint64_t)recommendedMaxWorkingSetSize
	workingSet = objc.Send[uint64](dev, objc.RegisterName("recommendedMaxWorkingSetSize"))
	// - (NSString *)name, autoreleased; -[NSString UTF8String] is copied by purego.
	if str := dev.Send(objc.RegisterName("name")); str != 0 {
		name = objc.Send[string](str, objc.RegisterName("UTF8String"))
	}
	return workingSet, name, nil
}

// gpuCoreCount reads the "gpu-core-count" property of the AGXAccelerator service, the
// Apple GPU's IOKit driver, in C:
//
//	io_service_t s = IOServiceGetMatchingService(kIOMainPortDefault, IOServiceMatching("AGXAccelerator"));
//	CFStringRef key = CFStringCreateWithCString(NULL, "gpu-core-count", kCFStringEncodingUTF8);
//	CFNumberRef n = IORegistryEntryCreateCFProperty(s, key, kCFAllocatorDefault, 0);
//	CFNumberGetValue(n, kCFNumberSInt64Type, &count);
//	CFRelease(n); CFRelease(key); IOObjectRelease(s);
func gpuCoreCount() (int, error) {
	iokit, err := purego.Dlopen(ioKitPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return 0, fmt.Errorf("loading IOKit: %w", err)
	}
	cf, err := purego.Dlopen(coreFoundationPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return 0, fmt.Errorf("loading CoreFoundation: %w", err)
	}
	var (
		// CFMutableDictionaryRef IOServiceMatching(const char *name)
		serviceMatching func(name string) uintptr
		// io_service_t IOServiceGetMatchingService(mach_port_t, CFDictionaryRef): consumes the dictionary.
		getMatchingService func(mainPort uint32, matching uintptr) uint32
		// CFTypeRef IORegistryEntryCreateCFProperty(io_registry_entry_t, CFStringRef, CFAllocatorRef, IOOptionBits)
		createCFProperty func(entry uint32, key uintptr, allocator uintptr, options uint32) uintptr
		// kern_return_t IOObjectRelease(io_object_t)
		objectRelease func(object uint32) int32
		// CFStringRef CFStringCreateWithCString(CFAllocatorRef, const char *, CFStringEncoding)
		stringCreate func(allocator uintptr, s string, encoding uint32) uintptr
		// CFTypeID CFGetTypeID(CFTypeRef), CFTypeID CFNumberGetTypeID(void)
		getTypeID       func(ref uintptr) uint64
		numberGetTypeID func() uint64
		// Boolean CFNumberGetValue(CFNumberRef, CFNumberType, void *): Boolean is one byte.
		numberGetValue func(number uintptr, typ int64, out *int64) uint8
		// void CFRelease(CFTypeRef)
		release func(ref uintptr)
	)
	for _, b := range []struct {
		lib  uintptr
		name string
		fn   any
	}{
		{iokit, "IOServiceMatching", &serviceMatching},
		{iokit, "IOServiceGetMatchingService", &getMatchingService},
		{iokit, "IORegistryEntryCreateCFProperty", &createCFProperty},
		{iokit, "IOObjectRelease", &objectRelease},
		{cf, "CFStringCreateWithCString", &stringCreate},
		{cf, "CFGetTypeID", &getTypeID},
		{cf, "CFNumberGetTypeID", &numberGetTypeID},
		{cf, "CFNumberGetValue", &numberGetValue},
		{cf, "CFRelease", &release},
	} {
		if err := bindFunc(b.lib, b.name, b.fn); err != nil {
			return 0, err
		}
	}

	matching := serviceMatching("AGXAccelerator")
	if matching == 0 {
		return 0, errors.New("IOServiceMatching returned NULL")
	}
	const kIOMainPortDefault = 0 // MACH_PORT_NULL: the default main port
	service := getMatchingService(kIOMainPortDefault, matching)
	if service == 0 {
		return 0, errors.New("no AGXAccelerator service")
	}
	defer objectRelease(service)

	key := stringCreate(0, "gpu-core-count", kCFStringEncodingUTF8)
	if key == 0 {
		return 0, errors.New("CFStringCreateWithCString returned NULL")
	}
	defer release(key)
	prop := createCFProperty(service, key, 0, 0)
	if prop == 0 {
		return 0, errors.New("AGXAccelerator has no gpu-core-count")
	}
	defer release(prop)
	if getTypeID(prop) != numberGetTypeID() {
		return 0, errors.New("gpu-core-count is not a number")
	}
	var n int64
	if numberGetValue(prop, kCFNumberSInt64Type, &n) == 0 || n <= 0 {
		return 0, fmt.Errorf("gpu-core-count %d unreadable", n)
	}
	return int(n), nil
}
