// decode_run's phase table: what a phase is, the records the weight ring's
// producer reads, and the words in front of a table (decode.cu says how
// the module fits together).

#define PH_NQ 0
#define PH_GEMV 1
#define PH_ATT 2

// One block an SM of 256 threads, with up to 255 registers a thread (512
// threads leave 128 registers a thread, where the kernel spills). A GEMV's
// rows go to the warps in tiles of 16.
#define DEC_THREADS 256
#define DEC_WARPS_MAX 8
// Phase descriptors kept in shared memory: the current phase, the `look`
// phases ahead, and one arriving (look ≤ 4).
#define DEC_RING 6
// head_dim ≤ this: attention units run with 4 accumulators a lane (the
// standalone kernel's 8 would crowd the registers the rest needs).
#define DEC_ATT_D 4
#define DEC_MAX_HEAD_DIM (32 * DEC_ATT_D)
// GEMV phases whose weights may be in the shared-memory ring at once (one
// mbarrier each).
#define WR_SLOTS 8
// Blocks the statistics slots have room for (tern_cuda::decode::STAT_BLOCKS).
#define STAT_BLOCKS 1024
// Float4 words of a row a thread quantizes from statistics in registers:
// k_pad ≤ 4 · NQS_WORDS · DEC_THREADS.
#define NQS_WORDS 8

// norm_quant's arguments for one row.
struct NqArgs {
    const float* x;
    const float* w;
    float* y;
    i8* q;
    float* d;
    int* lsum;
    int ne0;
    int k_pad;
    int norm;
    float eps;
};
static_assert(sizeof(NqArgs) == 64, "NqArgs layout (tern_cuda::args::NormQuantArgs)");

// A ternary GEMV phase. `fused` (enum Fused): FUSED_LEVELS reads nq.q /
// nq.d / nq.lsum; FUSED_BLOCK has every block norm and quantize nq.x into
// shared memory with block reductions; FUSED_STATS the same from the
// statistics slot `stat_in`. `rows` counts virtual rows:
// (gate, up) pairs when pair_act ≥ 0, else the batch's matrices' rows end
// to end. `stat_out` ≥ 0: each block leaves (Σ out², max |out · stat_w|) of
// the rows it wrote in that slot, for the next phase's norm (stat_w null:
// an unweighted norm). An attention phase uses stat_w / stat_out alone.
struct GemvArgs {
    TernaryBatch b;
    NqArgs nq;
    const float* stat_w;
    int fused;
    int pair_act;
    int rows;
    int k_pad;
    int stat_out;
    int stat_in;
};
static_assert(sizeof(GemvArgs) == 240, "GemvArgs layout (tern_cuda::decode::GemvArgs)");

// `att_block` (attention phases): 1 takes a KV head a block (att_block),
// 0 the (KV head, split) units.
struct Phase {
    int kind;
    int att_block;
    GemvArgs g;
    AttArgs a;
};
static_assert(sizeof(Phase) == 384, "Phase layout (tern_cuda::decode::Phase)");
#define PHASE_WORDS ((int)(sizeof(Phase) / 4))

// What the producer needs of a GEMV phase, in the order of the GEMV phases
// (tern_cuda::decode::Copy): the table holds them after the phases, and each
// block keeps them in shared memory, so that refilling the ring reads no
// global memory while the block waits at a barrier.
struct Copy {
    const u8* w[3];
    int rows[3];
    int n;
    int vrows;
    int k_pad;
    int pair;
    int pad;
};
static_assert(sizeof(Copy) == 56, "Copy layout (tern_cuda::decode::Copy)");
#define COPY_WORDS ((int)(sizeof(Copy) / 4))

// The words in front of a table (tern_cuda::decode::HEADER_BYTES): the
// barrier counter (word 0), the launch count and the blocks done with this
// launch (words 32 and 48, on their own line), then two statistics slots of
// STAT_BLOCKS float2 from byte 256.
#define BAR_EPOCH 32
#define BAR_DONE 48
#define STATS_AT 64
// Then, from word ROWS_AT, two slots of ROW_MAX floats: the rows those
// writers also leave multiplied by the next norm's weight.
#define ROWS_AT (STATS_AT + 2 * STAT_BLOCKS * 2)
#define ROW_MAX 8192

// Trace stamps per (phase, block), 8 u64 (tern_cuda::decode::trace_summary):
// start, input quantized, done, input staged, weights ready, rows done,
// ring refilled.
#define TR_START 0
#define TR_QUANT 1
#define TR_DONE 2
#define TR_STAGED 3
#define TR_READY 4
#define TR_ROWS 5
#define TR_ISSUED 6
// Phase 0 only: the kernel's entry.
#define TR_ENTRY 7
#define TR_SLOTS 8
