/* The driver library ABI: a versioned C table of function pointers.
 *
 * Driver libraries (libaccel_driver_<name>.so, loaded with dlopen) and the runtime meet only
 * through this header: C types, C calling convention, no C++ object, exception, allocator or
 * standard library type crosses it, so a driver built by another compiler or against another
 * C++ runtime loads as well. The runtime wraps the table in its C++ Driver interface
 * (runtime/driver.h: what each call does and how it maps onto CUDA and Level Zero); a driver
 * written in C++ against that interface fills the table with accel::rt::export_driver
 * (runtime/driver_export.h).
 *
 * Versioning: abi_version changes when an existing entry changes meaning; entries are only
 * ever appended. The runtime passes a zeroed table and its size; the driver fills what both
 * know and writes the size it filled into struct_size. An entry the driver leaves NULL, or one
 * past struct_size, is absent: optional entries say what absence means; a required entry that
 * is absent makes the runtime refuse the library.
 *
 * Every entry returns an accel_drv_status; on failure the message of the calling thread's last
 * failed call is last_error(self) (valid until that thread's next call into the driver).
 * ACCEL_DRV_DEVICE_LOST is sticky: the device's context is unusable for the rest of the process
 * (CUDA's asynchronous errors, such as an illegal address in a kernel), and the runtime refuses
 * every later call with the first such message.
 */
#ifndef ACCEL_RUNTIME_DRIVER_ABI_H_
#define ACCEL_RUNTIME_DRIVER_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ACCEL_DRIVER_ABI_VERSION 3

/* The numbering of accel::rt::ErrorCode (checked where the runtime reads it). */
typedef enum accel_drv_status {
  ACCEL_DRV_SUCCESS = 0,
  ACCEL_DRV_INVALID_VALUE = 1,
  ACCEL_DRV_INVALID_DEVICE = 2,
  ACCEL_DRV_INVALID_HANDLE = 3,
  ACCEL_DRV_INVALID_POINTER = 4,
  ACCEL_DRV_OUT_OF_MEMORY = 5,
  ACCEL_DRV_NOT_READY = 6,
  ACCEL_DRV_CAPTURE_UNSUPPORTED = 7,
  ACCEL_DRV_CAPTURE_INVALIDATED = 8,
  ACCEL_DRV_CAPTURE_UNJOINED = 9,
  ACCEL_DRV_NOT_SUPPORTED = 10,
  ACCEL_DRV_INITIALIZATION_ERROR = 11,
  ACCEL_DRV_TASK_FAILED = 12,
  ACCEL_DRV_DRIVER_ERROR = 13,
  ACCEL_DRV_DEVICE_LOST = 14
} accel_drv_status;

typedef enum accel_drv_copy_kind {
  ACCEL_DRV_HOST_TO_HOST = 0,
  ACCEL_DRV_HOST_TO_DEVICE = 1,
  ACCEL_DRV_DEVICE_TO_HOST = 2,
  ACCEL_DRV_DEVICE_TO_DEVICE = 3
} accel_drv_copy_kind;

typedef enum accel_drv_capture_mode {
  ACCEL_DRV_CAPTURE_GLOBAL = 0,
  ACCEL_DRV_CAPTURE_THREAD_LOCAL = 1,
  ACCEL_DRV_CAPTURE_RELAXED = 2
} accel_drv_capture_mode;

typedef enum accel_drv_memory_type {
  ACCEL_DRV_MEMORY_UNREGISTERED = 0, /* unknown to the driver: ordinary host memory */
  ACCEL_DRV_MEMORY_HOST = 1,         /* page-locked or registered host memory */
  ACCEL_DRV_MEMORY_DEVICE = 2,
  ACCEL_DRV_MEMORY_MANAGED = 3
} accel_drv_memory_type;

typedef struct accel_drv_device_properties {
  char name[256];
  uint64_t total_memory;
  int32_t compute_units;
  int32_t major;
  int32_t minor;
  int32_t max_threads_per_compute_unit;
  int32_t integrated;
  int32_t max_kernel_args;
  int32_t max_kernel_buffers;
} accel_drv_device_properties;

typedef struct accel_drv_memory_info {
  uint64_t free;
  uint64_t total;
} accel_drv_memory_info;

/* Nonzero: the driver does it (the meaning of accel::rt::DriverCapabilities). */
typedef struct accel_drv_capabilities {
  int32_t graphs;
  int32_t host_functions;
  int32_t timing_events;
  int32_t host_accessible_memory;
  int32_t native_handles;
} accel_drv_capabilities;

typedef struct accel_drv_pointer_attributes {
  int32_t type;   /* accel_drv_memory_type */
  int32_t device; /* for device and managed memory; -1 otherwise */
} accel_drv_pointer_attributes;

/* The numbering of accel::rt::Sensor (units there: percent, degrees C, mW, MHz, bytes). */
typedef enum accel_drv_sensor {
  ACCEL_DRV_SENSOR_UTILIZATION = 0,
  ACCEL_DRV_SENSOR_MEMORY_UTILIZATION = 1,
  ACCEL_DRV_SENSOR_TEMPERATURE = 2,
  ACCEL_DRV_SENSOR_POWER_DRAW = 3,
  ACCEL_DRV_SENSOR_CLOCK_RATE = 4,
  ACCEL_DRV_SENSOR_MEMORY_USED = 5
} accel_drv_sensor;

typedef struct accel_drv_process {
  int64_t pid;
  uint64_t memory; /* device memory it holds, bytes */
} accel_drv_process;

/* Opaque bytes that name device memory for another process (cudaIpcMemHandle_t's size). */
typedef struct accel_drv_ipc_handle {
  unsigned char bytes[64];
} accel_drv_ipc_handle;

typedef struct accel_driver accel_driver; /* the driver's own state */
typedef struct accel_drv_stream_s* accel_drv_stream;
typedef struct accel_drv_event_s* accel_drv_event;
typedef struct accel_drv_graph_s* accel_drv_graph;
typedef struct accel_drv_graph_exec_s* accel_drv_graph_exec;

/* Work the runtime runs on the host in stream order: returns 0, or nonzero after writing what
 * failed into `error` (the driver then reports ACCEL_DRV_TASK_FAILED at the next synchronize).
 * The driver calls `release(payload)` exactly once, when it will not call fn again: after fn
 * ran outside a capture, when the graph holding it is destroyed, or at once when submission
 * fails. */
typedef int (*accel_drv_host_fn)(void* payload, char* error, size_t error_len);
typedef void (*accel_drv_release_fn)(void* payload);

typedef struct accel_driver_table {
  uint32_t struct_size; /* bytes the driver filled */
  uint32_t abi_version; /* ACCEL_DRIVER_ABI_VERSION of the driver */
  accel_driver* self;
  const char* name; /* lives as long as the driver */
  accel_drv_capabilities capabilities;
  void (*destroy)(accel_driver* self); /* frees everything open made */
  const char* (*last_error)(accel_driver* self);

  /* identity and devices */
  int (*device_count)(accel_driver* self, int* count);
  int (*device_properties)(accel_driver* self, int device, accel_drv_device_properties* out);
  int (*set_device)(accel_driver* self, int device);
  int (*mem_get_info)(accel_driver* self, int device, accel_drv_memory_info* out);

  /* memory: *out is NULL (and the status success) when memory is exhausted */
  int (*raw_alloc)(accel_driver* self, int device, size_t size, void** out);
  int (*raw_free)(accel_driver* self, int device, void* ptr, size_t size);
  int (*host_alloc)(accel_driver* self, size_t size, void** out);
  int (*host_free)(accel_driver* self, void* ptr, size_t size);

  /* streams */
  int (*stream_priority_range)(accel_driver* self, int* least, int* greatest);
  int (*stream_create)(accel_driver* self, int device, int priority, accel_drv_stream* out);
  int (*stream_destroy)(accel_driver* self, accel_drv_stream stream);
  int (*launch_host_func)(accel_driver* self, accel_drv_stream stream, accel_drv_host_fn fn,
                          void* payload, accel_drv_release_fn release, const char* label);
  int (*memcpy_async)(accel_driver* self, void* dst, const void* src, size_t size,
                      int kind /* accel_drv_copy_kind */, accel_drv_stream stream);
  int (*memset_async)(accel_driver* self, void* dst, int value, size_t size,
                      accel_drv_stream stream);
  int (*stream_query)(accel_driver* self, accel_drv_stream stream, int* done);
  int (*stream_synchronize)(accel_driver* self, accel_drv_stream stream);

  /* events */
  int (*event_create)(accel_driver* self, int device, int timing, accel_drv_event* out);
  int (*event_destroy)(accel_driver* self, accel_drv_event event);
  int (*event_record)(accel_driver* self, accel_drv_event event, accel_drv_stream stream);
  int (*stream_wait_event)(accel_driver* self, accel_drv_stream stream, accel_drv_event event);
  int (*event_query)(accel_driver* self, accel_drv_event event, int* done);
  int (*event_synchronize)(accel_driver* self, accel_drv_event event);
  int (*event_elapsed_ms)(accel_driver* self, accel_drv_event start, accel_drv_event end,
                          float* out);

  /* graphs (required when capabilities.graphs) */
  int (*stream_begin_capture)(accel_driver* self, accel_drv_stream stream,
                              int mode /* accel_drv_capture_mode */);
  int (*stream_end_capture)(accel_driver* self, accel_drv_stream stream, accel_drv_graph* out);
  int (*graph_node_count)(accel_driver* self, accel_drv_graph graph, size_t* out);
  int (*graph_instantiate)(accel_driver* self, accel_drv_graph graph, accel_drv_graph_exec* out);
  int (*graph_launch)(accel_driver* self, accel_drv_graph_exec exec, accel_drv_stream stream);
  int (*graph_destroy)(accel_driver* self, accel_drv_graph graph);
  int (*graph_exec_destroy)(accel_driver* self, accel_drv_graph_exec exec);

  /* optional entries */
  /* Absent: device memory needs no bracketing for host access. */
  int (*host_access_begin)(accel_driver* self, int device, const void* ptr, size_t size);
  int (*host_access_end)(accel_driver* self, int device, const void* ptr, size_t size);
  /* Absent: no vendor handles (capabilities.native_handles is then ignored). */
  int (*stream_native_handle)(accel_driver* self, accel_drv_stream stream, void** out);
  /* Absent: graph debug dumps are not supported. */
  int (*graph_debug_dump)(accel_driver* self, accel_drv_graph graph, const char* path);
  /* Absent: the driver has no per-thread capture modes. */
  int (*thread_capture_mode_exchange)(accel_driver* self, int mode, int* previous);
  /* What the driver knows of memory the runtime did not allocate (another library's device
   * memory, registered host memory). Absent: every such pointer is ordinary host memory. */
  int (*pointer_attributes)(accel_driver* self, const void* ptr, accel_drv_pointer_attributes* out);
  /* A sentence for out-of-memory errors: how to give the device more memory (valid until the
   * thread's next call). Absent: nothing to add. */
  const char* (*oom_hint)(accel_driver* self);
  /* A driver stream over a native handle the driver did not create, and its priority; the
   * runtime never destroys it. Absent: such handles are refused. */
  int (*stream_adopt)(accel_driver* self, int device, void* native, accel_drv_stream* out,
                      int* priority);
  /* A sensor's reading (sensor: accel_drv_sensor); ACCEL_DRV_NOT_SUPPORTED, with last_error
   * saying why, for a sensor the device lacks. Absent: no sensor. */
  int (*device_sensor)(accel_driver* self, int device, int sensor, int64_t* out);
  /* The processes using the device: the first `capacity` in `out`, how many there are in
   * *count (call again with more room when it exceeds capacity). Absent: not listed. */
  int (*device_processes)(accel_driver* self, int device, accel_drv_process* out, size_t capacity,
                          size_t* count);
  /* Virtual memory (accel::rt::Driver::va_*), for expandable segments: all five, or none
   * (absent: no virtual memory). va_map sets *mapped to 0 when the device has no memory left
   * for it. */
  int (*va_granularity)(accel_driver* self, int device, size_t* out);
  int (*va_reserve)(accel_driver* self, int device, size_t size, void** out);
  int (*va_release)(accel_driver* self, int device, void* ptr, size_t size);
  int (*va_map)(accel_driver* self, int device, void* ptr, size_t size, int* mapped);
  int (*va_unmap)(accel_driver* self, int device, void* ptr, size_t size);
  /* Interprocess memory (accel::rt::Driver::ipc_*), for device memory shared with other
   * processes: all three, or none (absent: device memory cannot be shared). */
  int (*ipc_get_mem_handle)(accel_driver* self, int device, void* base, size_t size,
                            accel_drv_ipc_handle* out);
  int (*ipc_open_mem_handle)(accel_driver* self, int device, const accel_drv_ipc_handle* handle,
                             void** out, size_t* size);
  int (*ipc_close_mem_handle)(accel_driver* self, int device, void* ptr);
  /* Interprocess events (accel::rt::Driver::event_create_ipc, ipc_get_event_handle,
   * ipc_open_event_handle), events other processes wait on: all three, or none (absent: events
   * stay in their process). Events made by either are destroyed with event_destroy. The handle
   * has cudaIpcEventHandle_t's size, as accel_drv_ipc_handle. */
  int (*event_create_ipc)(accel_driver* self, int device, accel_drv_event* out);
  int (*ipc_get_event_handle)(accel_driver* self, accel_drv_event event, accel_drv_ipc_handle* out);
  int (*ipc_open_event_handle)(accel_driver* self, int device, const accel_drv_ipc_handle* handle,
                               accel_drv_event* out);
  /* The device's UUID, 16 bytes into out (CUDA's cudaDeviceProp::uuid: the same device gives
   * the same bytes in every process). Absent: all zero, unknown. */
  int (*device_uuid)(accel_driver* self, int device, uint8_t* out);
} accel_driver_table;

/* The symbol a driver library exports (and one optional one, below):
 *   int accel_driver_open(uint32_t abi_version, accel_driver_table* table, size_t table_size,
 *                         char* error, size_t error_len);
 * Fills `table` (at most table_size bytes) and returns 0, or returns nonzero after writing why
 * the driver cannot run here (no device, a missing vendor library, another ABI version) into
 * `error`. Nothing is to be destroyed after a refusal. */
typedef int (*accel_driver_open_fn)(uint32_t abi_version, accel_driver_table* table,
                                    size_t table_size, char* error, size_t error_len);

/* Optional: `int accel_driver_count_devices(void)` returns the number of devices the driver
 * would open, found without initializing the vendor runtime in this process (for CUDA: NVML,
 * not cudaGetDeviceCount, whose initialization a forked child cannot use), or -1 when it
 * cannot count that way (the runtime then opens the table and asks device_count). The runtime
 * counts devices this way before it starts (torch.accel.device_count()). */
#define ACCEL_DRIVER_COUNT_SYMBOL "accel_driver_count_devices"
typedef int (*accel_driver_count_devices_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* ACCEL_RUNTIME_DRIVER_ABI_H_ */
