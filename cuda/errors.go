package cuda

import (
	"errors"
	"fmt"
	"strconv"
)

// Result is a CUresult code. It is never returned as an error itself (a
// CUDA_SUCCESS value stored in an error would be non-nil); failures come
// back as *Error. Result implements error only so that it can be the
// target of errors.Is:
//
//	if errors.Is(err, cuda.ErrorStreamCaptureUnsupported) { ... }
type Result int32

// CUresult codes that callers or the simulation use.
const (
	Success                       Result = 0
	ErrorInvalidValue             Result = 1
	ErrorOutOfMemory              Result = 2
	ErrorNotInitialized           Result = 3
	ErrorDeinitialized            Result = 4
	ErrorStubLibrary              Result = 34
	ErrorNoDevice                 Result = 100
	ErrorInvalidDevice            Result = 101
	ErrorInvalidImage             Result = 200
	ErrorInvalidContext           Result = 201
	ErrorNoBinaryForGPU           Result = 209
	ErrorInvalidPTX               Result = 218
	ErrorUnsupportedPTXVersion    Result = 222
	ErrorInvalidHandle            Result = 400
	ErrorIllegalState             Result = 401
	ErrorLossyQuery               Result = 402
	ErrorNotFound                 Result = 500
	ErrorNotReady                 Result = 600
	ErrorIllegalAddress           Result = 700
	ErrorLaunchOutOfResources     Result = 701
	ErrorMisalignedAddress        Result = 716
	ErrorLaunchFailed             Result = 719
	ErrorNotPermitted             Result = 800
	ErrorNotSupported             Result = 801
	ErrorStreamCaptureUnsupported Result = 900
	ErrorStreamCaptureInvalidated Result = 901
	ErrorStreamCaptureMerge       Result = 902
	ErrorStreamCaptureUnmatched   Result = 903
	ErrorStreamCaptureUnjoined    Result = 904
	ErrorStreamCaptureIsolation   Result = 905
	ErrorStreamCaptureImplicit    Result = 906
	ErrorCapturedEvent            Result = 907
	ErrorStreamCaptureWrongThread Result = 908
	ErrorGraphExecUpdateFailure   Result = 910
	ErrorUnknown                  Result = 999
)

// resultNames is the static table of CUresult names from cuda.h (CUDA
// 13.0). The driver's cuGetErrorName is preferred when it knows the code.
var resultNames = map[Result]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
	5: "CUDA_ERROR_PROFILER_DISABLED", 6: "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
	7: "CUDA_ERROR_PROFILER_ALREADY_STARTED", 8: "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
	34: "CUDA_ERROR_STUB_LIBRARY", 46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
	202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 205: "CUDA_ERROR_MAP_FAILED",
	206: "CUDA_ERROR_UNMAP_FAILED", 207: "CUDA_ERROR_ARRAY_IS_MAPPED",
	208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	210: "CUDA_ERROR_ALREADY_ACQUIRED", 211: "CUDA_ERROR_NOT_MAPPED",
	212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", 213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE", 215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
	216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", 217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX", 219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
	220: "CUDA_ERROR_NVLINK_UNCORRECTABLE", 221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", 225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
	300: "CUDA_ERROR_INVALID_SOURCE", 301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", 303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE", 401: "CUDA_ERROR_ILLEGAL_STATE",
	402: "CUDA_ERROR_LOSSY_QUERY", 500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT", 703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", 709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT", 711: "CUDA_ERROR_TOO_MANY_PEERS",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS", 717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 911: "CUDA_ERROR_EXTERNAL_DEVICE",
	912: "CUDA_ERROR_INVALID_CLUSTER_SIZE", 999: "CUDA_ERROR_UNKNOWN",
}

// String returns the code's name from the static table, or
// "CUDA_ERROR_<n>" for a code the table lacks.
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return "CUDA_ERROR_" + strconv.Itoa(int(r))
}

// Error makes Result usable as an errors.Is target.
func (r Result) Error() string { return r.String() }

// Error is a failed driver call (or a simulated one): the operation, the
// driver's code and the driver's name for it.
type Error struct {
	Op   string // the driver function, e.g. "cuMemAlloc_v2"
	Code Result
	Name string // the driver's name for Code; empty means Code.String()
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = e.Code.String()
	}
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, name, int32(e.Code))
}

// Is reports whether target is this error's Result code.
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Code
}

// Code returns the CUresult carried by err (through wrapping), Success for
// nil, and ErrorUnknown for an error that carries none.
func Code(err error) Result {
	if err == nil {
		return Success
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ErrorUnknown
}

// CodeName returns Code(err)'s name: "CUDA_SUCCESS" for nil. Conformance
// lines print it so that the driver's and the simulation's runs compare.
func CodeName(err error) string { return Code(err).String() }

// ErrNoDriver is wrapped by Open's error when libcuda.so.1 cannot be
// loaded (no NVIDIA driver on this machine).
var ErrNoDriver = errors.New("no CUDA driver")
