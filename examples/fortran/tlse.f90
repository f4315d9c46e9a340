! Fortran 2003 interface to the TiledLSE C API (tlse.h) through iso_c_binding: the subset the
! examples use (context, cross-entropy forward/backward and the step in one call, the contrastive
! loss forward/backward, the distillation loss forward/backward, errors), and the log-sum-exp
! their checks take. Fortran arrays are
! column-major, so a C row-major n x d matrix is a Fortran array of shape (d, n).
module tlse
  use, intrinsic :: iso_c_binding
  implicit none

  integer(c_int), parameter :: TLSE_SUCCESS = 0, TLSE_ERROR_INVALID_ARGUMENT = 1
  integer(c_int), parameter :: TLSE_DEVICE_HOST = 0, TLSE_DEVICE_CUDA = 1
  integer(c_int), parameter :: TLSE_F32 = 0, TLSE_F64 = 1, TLSE_BF16 = 2, TLSE_F16 = 3
  integer(c_int32_t), parameter :: TLSE_REDUCTION_NONE = 0, TLSE_REDUCTION_SUM = 1, TLSE_REDUCTION_MEAN = 2
  integer(c_int32_t), parameter :: TLSE_DIRECTION_SYMMETRIC = 0, TLSE_DIRECTION_IMAGE_TO_TEXT = 1, &
      TLSE_DIRECTION_TEXT_TO_IMAGE = 2
  integer(c_int32_t), parameter :: TLSE_DIVERGENCE_FORWARD_KL = 0, TLSE_DIVERGENCE_REVERSE_KL = 1, &
      TLSE_DIVERGENCE_JSD = 2
  integer, parameter :: TLSE_DISTILLATION_ROW_STATS = 5

  ! Same members, types and order as tlse_cross_entropy_options in tlse.h.
  type, bind(c) :: tlse_cross_entropy_options
    integer(c_int64_t) :: ignore_index
    integer(c_int32_t) :: reduction
    integer(c_int32_t) :: accumulate
    integer(c_int64_t) :: shift
    real(c_double) :: softcap
    real(c_double) :: z_loss
    real(c_double) :: filter_eps
    integer(c_int32_t) :: detect_non_finite
    integer(c_int32_t) :: precision
    type(c_ptr) :: workspace
    integer(c_size_t) :: workspace_bytes
    integer(c_int64_t) :: memory_budget  ! bytes of workspace a call may use; 0: 256 MiB
    real(c_double) :: label_smoothing    ! F.cross_entropy's label_smoothing, in [0, 1]
  end type

  ! Same members, types and order as tlse_cross_entropy_extras in tlse.h (pass c_loc of one, or
  ! c_null_ptr for none, as the calls' extras).
  type, bind(c) :: tlse_cross_entropy_extras
    type(c_ptr) :: class_weight  ! v: class weights
    type(c_ptr) :: dlse          ! n: gradient reaching the forward's lse (backward)
    type(c_ptr) :: predicted     ! n: int64 argmax class per row (forward)
    type(c_ptr) :: accuracy      ! 1: fraction of scored rows predicted right (forward)
  end type

  ! Same members, types and order as tlse_contrastive_options in tlse.h.
  type, bind(c) :: tlse_contrastive_options
    real(c_double) :: scale  ! logit scale, 1 / temperature
    integer(c_int32_t) :: direction
    integer(c_int32_t) :: accumulate
    integer(c_int32_t) :: detect_non_finite
    integer(c_int32_t) :: precision
    type(c_ptr) :: workspace
    integer(c_size_t) :: workspace_bytes
    integer(c_int64_t) :: memory_budget
  end type

  ! Same members, types and order as tlse_distillation_options in tlse.h.
  type, bind(c) :: tlse_distillation_options
    integer(c_int32_t) :: divergence  ! TLSE_DIVERGENCE_*
    integer(c_int32_t) :: reduction
    real(c_double) :: beta            ! JSD's weight of the teacher, in [0, 1]
    real(c_double) :: temperature     ! divides both logits; no temperature^2 factor
    real(c_double) :: alpha           ! weight of the student's cross-entropy, in [0, 1]
    integer(c_int64_t) :: ignore_index
    integer(c_int64_t) :: shift
    integer(c_int32_t) :: accumulate
    integer(c_int32_t) :: detect_non_finite
    type(c_ptr) :: workspace
    integer(c_size_t) :: workspace_bytes
    integer(c_int64_t) :: memory_budget
  end type

  interface
    integer(c_int) function tlse_context_create(context, cuda_device) bind(c, name="tlse_context_create")
      import :: c_int, c_ptr
      type(c_ptr), intent(out) :: context
      integer(c_int), value :: cuda_device
    end function

    integer(c_int) function tlse_context_destroy(context) bind(c, name="tlse_context_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: context
    end function

    type(c_ptr) function tlse_last_error_c() bind(c, name="tlse_last_error")
      import :: c_ptr
    end function

    subroutine tlse_cross_entropy_options_default(options) bind(c, name="tlse_cross_entropy_options_default")
      import :: tlse_cross_entropy_options
      type(tlse_cross_entropy_options), intent(out) :: options
    end subroutine

    integer(c_int) function tlse_cross_entropy_forward(context, device, stream, dtype, n, v, d, e, c, bias, &
        targets, loss, lse, vocab_order, extras, options) bind(c, name="tlse_cross_entropy_forward")
      import :: c_int, c_int64_t, c_ptr, tlse_cross_entropy_options
      type(c_ptr), value :: context, stream, e, c, bias, targets, loss, lse, vocab_order, extras
      integer(c_int), value :: device, dtype
      integer(c_int64_t), value :: n, v, d
      type(tlse_cross_entropy_options), intent(in) :: options
    end function

    integer(c_int) function tlse_cross_entropy_backward(context, device, stream, dtype, n, v, d, e, c, bias, &
        targets, lse, vocab_order, dloss, de, dc, dbias, extras, options) bind(c, name="tlse_cross_entropy_backward")
      import :: c_int, c_int64_t, c_ptr, tlse_cross_entropy_options
      type(c_ptr), value :: context, stream, e, c, bias, targets, lse, vocab_order, dloss, de, dc, dbias, extras
      integer(c_int), value :: device, dtype
      integer(c_int64_t), value :: n, v, d
      type(tlse_cross_entropy_options), intent(in) :: options
    end function

    integer(c_int) function tlse_cross_entropy_with_gradients(context, device, stream, dtype, n, v, d, e, c, bias, &
        targets, dloss, loss, de, dc, dbias, extras, options) bind(c, name="tlse_cross_entropy_with_gradients")
      import :: c_int, c_int64_t, c_ptr, tlse_cross_entropy_options
      type(c_ptr), value :: context, stream, e, c, bias, targets, dloss, loss, de, dc, dbias, extras
      integer(c_int), value :: device, dtype
      integer(c_int64_t), value :: n, v, d
      type(tlse_cross_entropy_options), intent(in) :: options
    end function

    subroutine tlse_contrastive_options_default(options) bind(c, name="tlse_contrastive_options_default")
      import :: tlse_contrastive_options
      type(tlse_contrastive_options), intent(out) :: options
    end subroutine

    integer(c_int) function tlse_contrastive_forward(context, device, stream, dtype, b, c, images, texts, labels, &
        loss, row_lse, col_lse, options) bind(c, name="tlse_contrastive_forward")
      import :: c_int, c_int64_t, c_ptr, tlse_contrastive_options
      type(c_ptr), value :: context, stream, images, texts, labels, loss, row_lse, col_lse
      integer(c_int), value :: device, dtype
      integer(c_int64_t), value :: b, c
      type(tlse_contrastive_options), intent(in) :: options
    end function

    integer(c_int) function tlse_contrastive_backward(context, device, stream, dtype, b, c, images, texts, labels, &
        row_lse, col_lse, dloss, dimages, dtexts, dscale, extras, options) bind(c, name="tlse_contrastive_backward")
      import :: c_int, c_int64_t, c_ptr, tlse_contrastive_options
      type(c_ptr), value :: context, stream, images, texts, labels, row_lse, col_lse, dloss, dimages, dtexts, dscale, &
          extras
      integer(c_int), value :: device, dtype
      integer(c_int64_t), value :: b, c
      type(tlse_contrastive_options), intent(in) :: options
    end function

    subroutine tlse_distillation_options_default(options) bind(c, name="tlse_distillation_options_default")
      import :: tlse_distillation_options
      type(tlse_distillation_options), intent(out) :: options
    end subroutine

    integer(c_int) function tlse_distillation_loss(context, device, stream, dtype, n, v, d_s, d_t, hs, ws, ht, wt, &
        targets, loss, row_stats, options) bind(c, name="tlse_distillation_loss")
      import :: c_int, c_int64_t, c_ptr, tlse_distillation_options
      type(c_ptr), value :: context, stream, hs, ws, ht, wt, targets, loss, row_stats
      integer(c_int), value :: device, dtype
      integer(c_int64_t), value :: n, v, d_s, d_t
      type(tlse_distillation_options), intent(in) :: options
    end function

    integer(c_int) function tlse_distillation_loss_backward(context, device, stream, dtype, n, v, d_s, d_t, hs, ws, &
        ht, wt, targets, row_stats, dloss, dhs, dws, dht, dwt, options) bind(c, name="tlse_distillation_loss_backward")
      import :: c_int, c_int64_t, c_ptr, tlse_distillation_options
      type(c_ptr), value :: context, stream, hs, ws, ht, wt, targets, row_stats, dloss, dhs, dws, dht, dwt
      integer(c_int), value :: device, dtype
      integer(c_int64_t), value :: n, v, d_s, d_t
      type(tlse_distillation_options), intent(in) :: options
    end function
  end interface

contains

  ! The last error of this thread as a Fortran string.
  function tlse_last_error() result(message)
    character(len=:), allocatable :: message
    character(kind=c_char), pointer :: chars(:)
    integer :: length
    call c_f_pointer(tlse_last_error_c(), chars, [4096])
    length = 0
    do while (chars(length + 1) /= c_null_char)
      length = length + 1
    end do
    allocate(character(len=length) :: message)
    message = transfer(chars(1:length), message)
  end function

  ! log(sum(exp(values))) under their max, for the examples' checks in plain loops.
  real(c_double) function log_sum_exp(values)
    real(c_double), intent(in) :: values(:)
    log_sum_exp = maxval(values) + log(sum(exp(values - maxval(values))))
  end function

  ! Stops the program with the last error's message unless status is TLSE_SUCCESS.
  subroutine tlse_check(status)
    integer(c_int), intent(in) :: status
    if (status /= TLSE_SUCCESS) then
      print '(a)', tlse_last_error()
      stop 1
    end if
  end subroutine

end module tlse
