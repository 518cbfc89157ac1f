//! The thin layer over the CUDA driver API (through cudarc's dynamically
//! loaded bindings): one device context, one stream, raw device memory,
//! kernel launches and graph capture. Everything above works in device
//! pointers and never touches cudarc directly.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use crate::error::CudaError;

/// Why no GPU can be used. Shown to the user as is.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    #[error("no CUDA driver: libcuda.so could not be loaded (is an NVIDIA driver installed?)")]
    NoDriver,
    #[error("the CUDA driver failed to start: {0}")]
    Init(String),
    #[error("no CUDA device found")]
    NoDevice,
    #[error("CUDA device {index} does not exist ({count} found)")]
    BadIndex { index: usize, count: usize },
}

/// A description of one device, for `tern info` and plans.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    pub total_mem: usize,
    pub arch: (i32, i32),
    pub sm_count: i32,
    /// Shared memory a block may use once a kernel opts in (227 KiB on Hopper).
    pub smem_optin: i32,
}

/// The driver's error `e` from `call`, with the `CUresult`'s number, name and text.
pub(crate) fn err(call: &'static str) -> impl Fn(result::DriverError) -> CudaError {
    move |e| {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
        let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        CudaError::Driver { call, code: e.0 as i32, name, text }
    }
}

/// A driver error as a line, for `Unavailable::Init`.
fn describe(call: &'static str) -> impl Fn(result::DriverError) -> Unavailable {
    move |e| Unavailable::Init(err(call)(e).to_string())
}

fn init() -> Result<i32, Unavailable> {
    // SAFETY: only probes whether the shared library loads.
    if !unsafe { sys::is_culib_present() } {
        return Err(Unavailable::NoDriver);
    }
    result::init().map_err(describe("cuInit"))?;
    result::device::get_count().map_err(describe("cuDeviceGetCount"))
}

/// All CUDA devices, or why there are none.
pub fn devices() -> Result<Vec<DeviceInfo>, Unavailable> {
    let count = init()?;
    if count == 0 {
        return Err(Unavailable::NoDevice);
    }
    (0..count as usize).map(info).collect()
}

fn info(index: usize) -> Result<DeviceInfo, Unavailable> {
    let dev = result::device::get(index as i32).map_err(describe("cuDeviceGet"))?;
    let attr = |a| unsafe { result::device::get_attribute(dev, a) }.map_err(describe("cuDeviceGetAttribute"));
    use sys::CUdevice_attribute::*;
    Ok(DeviceInfo {
        index,
        name: result::device::get_name(dev).map_err(describe("cuDeviceGetName"))?,
        total_mem: unsafe { result::device::total_mem(dev) }.map_err(describe("cuDeviceTotalMem"))?,
        arch: (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        smem_optin: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
    })
}

/// A device's primary context and the one stream all work goes through.
pub struct Gpu {
    pub info: DeviceInfo,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    pub stream: sys::CUstream,
    /// Page-locked staging for reads (logits every step): DMA runs at full
    /// speed into it, where a pageable destination is copied in pieces.
    pinned: std::sync::Mutex<Pinned>,
}

struct Pinned {
    ptr: *mut c_void,
    cap: usize,
}

/// Reads at least this large go through the pinned buffer.
const PINNED_MIN: usize = 64 * 1024;

// SAFETY: the context is made current on whichever thread uses it (`bind`),
// and the backend is used by one thread at a time (`&mut self`).
unsafe impl Send for Gpu {}

pub type DResult<T> = Result<T, CudaError>;

impl Gpu {
    pub fn open(index: usize) -> Result<Gpu, Unavailable> {
        let count = init()? as usize;
        if index >= count {
            return Err(if count == 0 { Unavailable::NoDevice } else { Unavailable::BadIndex { index, count } });
        }
        let info = info(index)?;
        let dev = result::device::get(index as i32).map_err(describe("cuDeviceGet"))?;
        // SAFETY: the primary context is retained for the life of `Gpu` and released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(describe("cuDevicePrimaryCtxRetain"))?;
        unsafe { result::ctx::set_current(ctx) }.map_err(describe("cuCtxSetCurrent"))?;
        let stream =
            result::stream::create(result::stream::StreamKind::NonBlocking).map_err(describe("cuStreamCreate"))?;
        Ok(Gpu { info, dev, ctx, stream, pinned: std::sync::Mutex::new(Pinned { ptr: std::ptr::null_mut(), cap: 0 }) })
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> DResult<()> {
        unsafe { result::ctx::set_current(self.ctx) }.map_err(err("cuCtxSetCurrent"))
    }

    pub fn alloc(&self, bytes: usize) -> DResult<u64> {
        self.bind()?;
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => CudaError::OutOfMemory { bytes },
            _ => err("cuMemAlloc")(e),
        })?;
        unsafe { result::memset_d8_async(ptr, 0, bytes.max(1), self.stream) }.map_err(err("cuMemsetD8Async"))?;
        Ok(ptr)
    }

    pub fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            // A failed free leaves nothing to recover; the context outlives it.
            let _ = unsafe { result::stream::synchronize(self.stream) };
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    /// Pinned host memory that kernels can read over the host link: the
    /// host pointer and the device's address of the same bytes.
    pub fn alloc_mapped(&self, bytes: usize) -> DResult<(*mut u8, u64)> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let host = unsafe { result::malloc_host(bytes.max(1), flags) }.map_err(err("cuMemHostAlloc"))?;
        let mut dev: sys::CUdeviceptr = 0;
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }.result();
        if let Err(e) = r {
            let _ = unsafe { result::free_host(host) };
            return Err(err("cuMemHostGetDevicePointer")(e));
        }
        Ok((host as *mut u8, dev))
    }

    pub fn free_mapped(&self, host: *mut u8) {
        if self.bind().is_ok() {
            let _ = unsafe { result::stream::synchronize(self.stream) };
            let _ = unsafe { result::free_host(host as *mut c_void) };
        }
    }

    /// Page-locks `len` bytes of existing host memory at `ptr` for every
    /// context (portable) and maps them into the device's address space:
    /// copies to and from them are direct DMA, and kernels can read and
    /// write them. Returns the device's address of the bytes.
    pub fn register_host(&self, ptr: *const u8, len: usize) -> DResult<u64> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, len, flags) }
            .result()
            .map_err(err("cuMemHostRegister"))?;
        let mut dev: sys::CUdeviceptr = 0;
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr as *mut c_void, 0) }.result();
        if let Err(e) = r {
            let _ = unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
            return Err(err("cuMemHostGetDevicePointer")(e));
        }
        Ok(dev)
    }

    pub fn unregister_host(&self, ptr: *const u8) {
        if self.bind().is_ok() {
            // The memory must not be in flight when it is released to its owner.
            let _ = unsafe { result::stream::synchronize(self.stream) };
            let _ = unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
        }
    }

    pub fn mem_info(&self) -> DResult<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().map_err(err("cuMemGetInfo"))
    }

    /// Host to device, ordered on the stream. `data` may be reused on return
    /// unless it is page-locked (`register_host`): the copy then runs
    /// asynchronously, and `data` must stay as it is until the next `sync`.
    pub fn upload(&self, dst: u64, data: &[u8]) -> DResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // A pageable source is staged before the call returns, so `data` may
        // change afterwards; the copy stays ordered with the kernels.
        unsafe { result::memcpy_htod_async(dst, data, self.stream) }.map_err(err("cuMemcpyHtoDAsync"))
    }

    /// A copy between any two addresses the device knows (device memory or
    /// mapped host memory), ordered on the stream; captured into a graph it
    /// becomes a copy node that the copy engine runs.
    pub fn copy_async(&self, dst: u64, src: u64, bytes: usize) -> DResult<()> {
        unsafe { sys::cuMemcpyAsync(dst, src, bytes, self.stream) }.result().map_err(err("cuMemcpyAsync"))
    }

    pub fn download(&self, src: u64, out: &mut [u8]) -> DResult<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        if out.len() >= PINNED_MIN {
            let mut p = self.pinned.lock().map_err(|_| CudaError::Other("pinned buffer lock poisoned".into()))?;
            if p.cap < out.len() {
                if !p.ptr.is_null() {
                    unsafe { result::free_host(p.ptr) }.map_err(err("cuMemFreeHost"))?;
                    p.ptr = std::ptr::null_mut();
                    p.cap = 0;
                }
                p.ptr = unsafe { result::malloc_host(out.len(), 0) }.map_err(err("cuMemHostAlloc"))?;
                p.cap = out.len();
            }
            // SAFETY: the pinned buffer holds `cap` ≥ out.len() bytes and is only used under the lock.
            let staging = unsafe { std::slice::from_raw_parts_mut(p.ptr as *mut u8, out.len()) };
            unsafe { result::memcpy_dtoh_async(staging, src, self.stream) }.map_err(err("cuMemcpyDtoHAsync"))?;
            self.sync()?;
            out.copy_from_slice(staging);
            return Ok(());
        }
        unsafe { result::memcpy_dtoh_async(out, src, self.stream) }.map_err(err("cuMemcpyDtoHAsync"))?;
        self.sync()
    }

    pub fn sync(&self) -> DResult<()> {
        unsafe { result::stream::synchronize(self.stream) }.map_err(err("cuStreamSynchronize"))
    }

    pub fn load_module(&self, image: &[u8]) -> DResult<sys::CUmodule> {
        self.bind()?;
        let mut owned = image.to_vec();
        owned.push(0);
        unsafe { result::module::load_data(owned.as_ptr() as *const c_void) }.map_err(err("cuModuleLoadData"))
    }

    /// Kernel `name` of `module`, allowed the device's whole opt-in shared
    /// memory (rows of long inputs are staged there).
    pub fn function(&self, module: sys::CUmodule, name: &str) -> DResult<sys::CUfunction> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| CudaError::Other(format!("kernel name {name:?} holds a NUL byte")))?;
        let f = unsafe { result::module::get_function(module, cname) }.map_err(err("cuModuleGetFunction"))?;
        let static_smem = unsafe {
            result::function::get_function_attribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        }
        .map_err(err("cuFuncGetAttribute"))?;
        let dynamic = (self.info.smem_optin - static_smem).max(0);
        unsafe {
            result::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic,
            )
        }
        .map_err(err("cuFuncSetAttribute"))?;
        Ok(f)
    }

    /// Blocks of `f` that fit one SM at once with `block` threads and `smem`
    /// bytes of dynamic shared memory.
    pub fn occupancy(&self, f: sys::CUfunction, block: u32, smem: usize) -> DResult<i32> {
        // SAFETY: `f` is a loaded function of this context.
        unsafe { result::occupancy::max_active_block_per_multiprocessor(f, block as i32, smem) }
            .map_err(err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))
    }

    /// Launches `f`. `params` point at the kernel's arguments in order. With
    /// `pdl`, the kernel may start while the previous one drains (it waits in
    /// `pdl_wait` for its inputs).
    pub fn launch(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        params: &mut [*mut c_void],
        pdl: bool,
    ) -> DResult<()> {
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: Default::default(),
            value: sys::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream,
            attrs: &mut attr,
            numAttrs: pdl as u32,
        };
        unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(err("cuLaunchKernelEx"))
    }

    pub fn begin_capture(&self) -> DResult<()> {
        unsafe {
            result::stream::begin_capture(self.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        }
        .map_err(err("cuStreamBeginCapture"))
    }

    /// Ends a capture and instantiates it.
    pub fn end_capture(&self) -> DResult<Graph> {
        let graph = unsafe { result::stream::end_capture(self.stream) }.map_err(err("cuStreamEndCapture"))?;
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
        unsafe { result::graph::destroy(graph) }.map_err(err("cuGraphDestroy"))?;
        Ok(Graph { exec: exec.map_err(err("cuGraphInstantiate"))? })
    }

    pub fn replay(&self, g: &Graph) -> DResult<()> {
        unsafe { result::graph::launch(g.exec, self.stream) }.map_err(err("cuGraphLaunch"))
    }

    pub fn event(&self) -> DResult<Event> {
        self.bind()?;
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(err("cuEventCreate"))?;
        Ok(Event(e))
    }

    pub fn record(&self, e: &Event) -> DResult<()> {
        unsafe { result::event::record(e.0, self.stream) }.map_err(err("cuEventRecord"))
    }

    /// Records `e` as a node of the graph being captured (a plain record
    /// during capture only orders work inside the capture).
    pub fn record_in_graph(&self, e: &Event) -> DResult<()> {
        let flags = sys::CUevent_record_flags_enum::CU_EVENT_RECORD_EXTERNAL as u32;
        unsafe { sys::cuEventRecordWithFlags(e.0, self.stream, flags) }.result().map_err(err("cuEventRecordWithFlags"))
    }

    pub fn device_ordinal(&self) -> sys::CUdevice {
        self.dev
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            let _ = unsafe { result::stream::synchronize(self.stream) };
            if let Ok(p) = self.pinned.get_mut() {
                if !p.ptr.is_null() {
                    let _ = unsafe { result::free_host(p.ptr) };
                }
            }
            let _ = unsafe { result::stream::destroy(self.stream) };
            let _ = unsafe { result::primary_ctx::release(self.dev) };
        }
    }
}

/// An instantiated CUDA graph.
pub struct Graph {
    exec: sys::CUgraphExec,
}

unsafe impl Send for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = unsafe { result::graph::exec_destroy(self.exec) };
    }
}

/// A timing event.
pub struct Event(sys::CUevent);

unsafe impl Send for Event {}

impl Event {
    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> DResult<f32> {
        unsafe { result::event::synchronize(end.0) }.map_err(err("cuEventSynchronize"))?;
        unsafe { result::event::elapsed(self.0, end.0) }.map_err(err("cuEventElapsedTime"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = unsafe { result::event::destroy(self.0) };
    }
}
